"""The sweeper's statement: a fresh wake-up for every job left Queued longer than the threshold."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg

from app.store import connector


@dataclass(frozen=True)
class Republished:
    """A job that got a fresh wake-up: its id, its tenant and the new outbox row's message id."""

    job_id: UUID
    tenant_id: UUID
    message_id: UUID


def republish_due(conn: psycopg.Connection, *, sweep_after_seconds: float,
                  batch_size: int = 500) -> list[Republished]:
    """One sweeper batch; returns the jobs that got a fresh wake-up."""
    rows = connector.fetch_all(conn, "sweeper_republish_due", dict(
        sweep_after_seconds=sweep_after_seconds, batch_size=batch_size))
    return [Republished(r["job_id"], r["tenant_id"], r["message_id"]) for r in rows]
