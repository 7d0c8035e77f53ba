"""What the worker reads around its writes, one function per statement in ``sql/worker.sql``.

The message is a hint: every decision starts from these reads of the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast
from uuid import UUID

import psycopg

from app.store import connector
from app.store.partner import Circuit
from app.store.types import ExpectedFile, Status

#: The destination columns ``worker_read_job`` reads, as ``DestinationConfig.from_row`` names them.
DESTINATION_COLUMNS = ("host", "port", "username", "remote_dir", "host_key", "credential_ref", "remote_hash",
                       "acknowledgments", "name_and_size_identify", "read_back", "active", "max_sessions",
                       "auto_retries")


@dataclass(frozen=True)
class JobView:
    """The job as the runner needs it, with what it decides on before its claim."""

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
    #: The destination's row (``DestinationConfig.from_row`` reads it), None when it is not the tenant's.
    destination: dict[str, Any] | None = field(default=None, compare=False)
    circuit: Circuit = field(default_factory=Circuit.closed, compare=False)
    #: A replacement's original's expected file; None for an original job, or an original that never
    #: reached cutoff 2 (then nothing can identify a file as its delivery).
    original_expected: ExpectedFile | None = None


def read_job(conn: psycopg.Connection, job_id: UUID) -> JobView | None:
    row = connector.fetch_one(conn, "worker_read_job", dict(job_id=job_id))
    if row is None:
        return None
    destination = None
    if row["destination_found"] is not None:
        destination = {"id": row["destination_id"], "tenant_id": row["tenant_id"],
                       **{name: row[name] for name in DESTINATION_COLUMNS}}
    original = None
    if row["original_file_name"] is not None and row["original_file_sha256"] is not None:
        original = ExpectedFile(row["original_file_name"], row["original_file_bytes"],
                                bytes(row["original_file_sha256"]))
    return JobView(id=row["id"], tenant_id=row["tenant_id"], status=Status(row["status"]), version=row["version"],
                   destination_id=row["destination_id"], delivery_key=row["delivery_key"],
                   replaces_job_id=row["replaces_job_id"], overwrite_agreement_ref=row["overwrite_agreement_ref"],
                   deferrals=row["deferrals"], last_deferral=row["last_deferral"],
                   deferred_for_seconds=None if row["deferred_for_seconds"] is None
                   else float(row["deferred_for_seconds"]),
                   destination=destination,
                   circuit=Circuit.from_row(row["circuit_state"], row["circuit_failures"], row["circuit_last_error"],
                                            row["circuit_probe_in_seconds"], row["circuit_probe_held"]),
                   original_expected=original)


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
