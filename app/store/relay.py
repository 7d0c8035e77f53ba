"""The relay's statements, run as exports_dispatcher: lock a batch of unpublished outbox rows, mark them published."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store import connector


@dataclass(frozen=True)
class OutboxMessage:
    message_id: UUID
    kind: str
    job_id: UUID
    created_at: datetime
    #: When a deferral's wake-up falls due; None: due when written.
    due_at: datetime | None = None
    #: The job's tenant, for the relay's log line; None for a row whose job is gone (none is, in practice).
    tenant_id: UUID | None = None

    @property
    def due(self) -> datetime:
        return self.due_at or self.created_at


@dataclass(frozen=True)
class Batch:
    rows: list[OutboxMessage]
    #: Seconds until the next unpublished row outside the batch falls due (0 or less: one is due now,
    #: held by another relay or beyond the batch); None when none waits.
    next_due_seconds: float | None


def claim_batch(conn: psycopg.Connection, *, batch_size: int) -> Batch:
    """Locks up to ``batch_size`` unpublished rows that are due, until the caller's transaction ends, and
    says when the next row outside them falls due."""
    rows = connector.fetch_all(conn, "relay_claim_batch", dict(batch_size=batch_size))
    seconds = rows[0]["next_due_seconds"] if rows else None
    return Batch([OutboxMessage(r["message_id"], r["kind"], r["job_id"], r["created_at"], r["due_at"], r["tenant_id"])
                  for r in rows if r["message_id"] is not None],
                 None if seconds is None else float(seconds))


def mark_published(conn: psycopg.Connection, *, message_ids: list[UUID]) -> int:
    return connector.execute(conn, "relay_mark_published", dict(message_ids=message_ids))
