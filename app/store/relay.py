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


def claim_batch(conn: psycopg.Connection, *, batch_size: int) -> list[OutboxMessage]:
    """Locks up to ``batch_size`` unpublished rows until the caller's transaction ends."""
    rows = connector.fetch_all(conn, "relay_claim_batch", dict(batch_size=batch_size))
    return [OutboxMessage(r["message_id"], r["kind"], r["job_id"], r["created_at"]) for r in rows]


def mark_published(conn: psycopg.Connection, *, message_ids: list[UUID]) -> int:
    return connector.execute(conn, "relay_mark_published", dict(message_ids=message_ids))
