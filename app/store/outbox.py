"""The relay's statements, run as exports_dispatcher."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store.queries import QUERIES


@dataclass(frozen=True)
class OutboxMessage:
    message_id: UUID
    kind: str
    job_id: UUID
    created_at: datetime


def claim_batch(conn: psycopg.Connection, *, batch_size: int) -> list[OutboxMessage]:
    """Locks up to ``batch_size`` unpublished rows until the caller's transaction ends."""
    rows = conn.execute(QUERIES["relay_claim_batch"], dict(batch_size=batch_size)).fetchall()
    return [OutboxMessage(r["message_id"], r["kind"], r["job_id"], r["created_at"]) for r in rows]


def mark_published(conn: psycopg.Connection, *, message_ids: list[UUID]) -> int:
    return conn.execute(QUERIES["relay_mark_published"], dict(message_ids=message_ids)).rowcount
