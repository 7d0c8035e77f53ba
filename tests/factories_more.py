"""More rows in a given state.

Every state is reached through the real statements under exports_app (claim, cutoff 2, the terminal
writes, recovery after ``expire_lease``), so a factory cannot produce an original the protocol could
not. The tools that force interleavings are in tests/support.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from app.store import cancellation, export, recovery
from app.store.types import CancellationOutcome, FailureCode, ReplacementResult, Status
from tests.factories import Job, Seeder

WORKER = "worker-test"
RECOVERY_RUN = "recovery-test"


class States:
    """Jobs in each state a replacement, a reconciliation or a correction cares about."""

    def __init__(self, seed: Seeder):
        self.seed = seed
        self.conn = seed.conn

    def outcome_unknown_by_worker(self, job: Job | None = None) -> Job:
        job = self.seed.delivering(job)
        assert export.try_finish_delivery(self.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                        outcome=Status.OUTCOME_UNKNOWN, detail="rename reply lost") == 1
        return job

    def outcome_unknown_by_recovery(self, job: Job | None = None) -> Job:
        job = self.seed.delivering(job)
        self.seed.expire_lease(job)
        assert recovery.resolve_delivering(self.conn, job_id=job.id, expired_attempt_id=job.attempt_id,
                                           resolution=Status.OUTCOME_UNKNOWN, evidence_summary="no receipt",
                                           recovery_run_id=RECOVERY_RUN)
        return job

    def failed(self, code: FailureCode, job: Job | None = None) -> Job:
        if code is FailureCode.NOT_DELIVERED:
            return self.seed.finished(Status.FAILED, job, failure_reason=FailureCode.NOT_DELIVERED)
        job = self.seed.running(job)
        if code is FailureCode.ATTEMPTS_EXHAUSTED:
            self.seed.expire_lease(job)
            assert recovery.exhaust_expired(self.conn, [(job.id, job.attempt_id)],
                                            max_attempts=1, recovery_run_id=RECOVERY_RUN)
        else:
            assert export.try_finish_failed(self.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                          failure_reason=code) == 1
        return job

    def stopped(self) -> Job:
        job = self.seed.running()
        self._cancel(job, CancellationOutcome.STOP_REQUESTED)
        assert export.try_finish_stopped(self.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                       stop_point="WhileBuilding") == 1
        return job

    def canceled(self) -> Job:
        job = self.seed.queued()
        self._cancel(job, CancellationOutcome.CANCELED_WHILE_QUEUED)
        return job

    def rejected(self) -> Job:
        job = self.seed.queued()
        assert export.reject(self.conn, job_id=job.id, checked_version=1)
        return job

    def in_state(self, status: Status, code: FailureCode | None = None) -> Job:
        """A fresh original in ``status`` (with ``code`` when Failed)."""
        builders: dict[Status, Callable[[], Job]] = {
            Status.QUEUED: self.seed.queued,
            Status.RUNNING: self.seed.running,
            Status.DELIVERING: self.seed.delivering,
            Status.COMPLETED: lambda: self.seed.finished(Status.COMPLETED),
            Status.OUTCOME_UNKNOWN: self.outcome_unknown_by_worker,
            Status.STOPPED: self.stopped,
            Status.CANCELED: self.canceled,
            Status.REJECTED: self.rejected,
        }
        job = self.failed(code) if status is Status.FAILED else builders[status]()
        assert self.seed.status(job) is status
        return job

    def replacement(self, original: Job, *, created_by: str = "ops-alice", reason: str = "original unresolved",
                    overwrite_agreement_ref: str | None = None) -> Job:
        """A queued replacement of ``original``, created through the real statement."""
        job_id = uuid.uuid4()
        result = export.create_replacement(self.conn, job_id=job_id, tenant_id=original.tenant_id,
                                         original_job_id=original.id, created_by=created_by,
                                         replacement_reason=reason, overwrite_agreement_ref=overwrite_agreement_ref)
        assert result is ReplacementResult.CREATED
        return Job(job_id, original.tenant_id, original.destination_id, original.delivery_key)

    def _cancel(self, job: Job, expected: CancellationOutcome) -> None:
        result = cancellation.request_cancellation(self.conn, tenant_id=job.tenant_id, job_id=job.id,
                                                   request_id=uuid.uuid4(), requested_by="ops-bob")
        assert result.outcome is expected


def insert_job_directly(admin: psycopg.Connection, job: Job, **columns: Any) -> None:
    """An export_jobs row written by the owner, bypassing every statement: only the schema stands in
    its way. ``columns`` override the defaults of a queued original of ``job``."""
    values: dict[str, Any] = dict(id=uuid.uuid4(), tenant_id=job.tenant_id, status="Queued", version=1,
                                  destination_id=job.destination_id, delivery_key=job.delivery_key,
                                  created_by="direct", woken_at=None)
    values.update(columns)
    names = [name for name in values if name != "woken_at"]
    placeholders = ", ".join(f"%({name})s" for name in names)
    admin.execute(
        f"INSERT INTO export_jobs ({', '.join(names)}, woken_at) VALUES ({placeholders}, clock_timestamp())",
        values)


def job_ids_with_key(admin: psycopg.Connection, tenant_id: UUID, delivery_key: str) -> list[UUID]:
    rows = admin.execute("SELECT id FROM export_jobs WHERE tenant_id = %s AND delivery_key = %s ORDER BY id",
                         (tenant_id, delivery_key)).fetchall()
    return [r["id"] for r in rows]


# --- a database shared by a module's read-only catalog checks ------------------------------------------


@contextmanager
def catalog_database(pg_server_url: str, template_db: str) -> Iterator[psycopg.Connection]:
    """An owner connection (dict rows) to one fresh copy of the migrated template, for tests that only
    read the catalog (grants, constraints, columns) and so need no copy of their own."""
    name = f"exports_c_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as server:
        server.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name),
                                                                        sql.Identifier(template_db)))
    try:
        with psycopg.connect(make_conninfo(pg_server_url, dbname=name), autocommit=True, row_factory=dict_row) as conn:
            yield conn
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as server:
            server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
