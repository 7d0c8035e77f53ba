"""The scavenger's read: which attempt each job that local files name is on, and in what state."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg

from app.store import connector
from app.store.types import Status


@dataclass(frozen=True)
class AttemptState:
    job_id: UUID
    status: Status
    attempt_id: UUID | None


def read_attempts(conn: psycopg.Connection, job_ids: list[UUID]) -> dict[UUID, AttemptState]:
    """The found jobs by id; a job that is missing is absent from the answer."""
    rows = connector.fetch_all(conn, "scavenger_read_attempts", dict(job_ids=job_ids))
    return {r["id"]: AttemptState(r["id"], Status(r["status"]), r["attempt_id"]) for r in rows}
