"""The sweeper's statement: a fresh wake-up for every job left Queued longer than the threshold."""

from __future__ import annotations

from uuid import UUID

import psycopg

from app.store import connector


def republish_due(conn: psycopg.Connection, *, sweep_after_seconds: float, batch_size: int = 500) -> list[UUID]:
    """One sweeper batch; returns the jobs that got a fresh wake-up."""
    rows = connector.fetch_all(conn, "sweeper_republish_due", dict(
        sweep_after_seconds=sweep_after_seconds, batch_size=batch_size))
    return [r["job_id"] for r in rows]
