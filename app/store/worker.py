"""What the worker reads around its writes, one function per statement in ``sql/worker.sql``.

The message is a hint: every decision starts from these reads of the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast
from uuid import UUID

import psycopg

from app.store import connector
from app.store.types import ExpectedFile, Status


@dataclass(frozen=True)
class JobView:
    """The job as the runner needs it."""

    id: UUID
    tenant_id: UUID
    status: Status
    version: int
    destination_id: UUID
    delivery_key: str
    replaces_job_id: UUID | None
    overwrite_agreement_ref: str | None
    #: How often the job was deferred, and seconds since its first deferral (None: never deferred).
    deferrals: int
    deferred_for_seconds: float | None
    last_deferral: str | None


def read_job(conn: psycopg.Connection, job_id: UUID) -> JobView | None:
    row = connector.fetch_one(conn, "worker_read_job", dict(job_id=job_id))
    if row is None:
        return None
    return JobView(id=row["id"], tenant_id=row["tenant_id"], status=Status(row["status"]), version=row["version"],
                   destination_id=row["destination_id"], delivery_key=row["delivery_key"],
                   replaces_job_id=row["replaces_job_id"], overwrite_agreement_ref=row["overwrite_agreement_ref"],
                   deferrals=row["deferrals"], last_deferral=row["last_deferral"],
                   deferred_for_seconds=None if row["deferred_for_seconds"] is None
                   else float(row["deferred_for_seconds"]))


def read_original_expected(conn: psycopg.Connection, job: JobView) -> ExpectedFile | None:
    """The original's expected file, or None for an original job or an original that never reached
    cutoff 2 (then nothing can identify a file as its delivery)."""
    if job.replaces_job_id is None:
        return None
    row = connector.fetch_one(conn, "worker_read_original_expected",
                              dict(tenant_id=job.tenant_id, original_job_id=job.replaces_job_id))
    if row is None or row["expected_file_name"] is None or row["expected_file_sha256"] is None:
        return None
    return ExpectedFile(row["expected_file_name"], row["expected_file_bytes"], bytes(row["expected_file_sha256"]))


def confirm_stops(conn: psycopg.Connection, watched: dict[UUID, UUID]) -> list[UUID]:
    """Of the watched ``{job_id: attempt_id}``, the jobs whose attempt has a recorded stop request."""
    rows = connector.fetch_all(conn, "worker_confirm_stops",
                               dict(job_ids=list(watched), attempt_ids=list(watched.values())))
    return [r["id"] for r in rows]


@contextmanager
def consenting_contacts_csv(conn: psycopg.Connection, tenant_id: UUID) -> Iterator[Iterator[bytes]]:
    """The tenant's consenting contacts as CSV, written by PostgreSQL itself, in blocks as they arrive."""
    with connector.copy(conn, "worker_copy_consenting_contacts", dict(tenant_id=tenant_id)) as copied:
        yield cast("Iterator[bytes]", iter(copied))
