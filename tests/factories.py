"""Rows in a given state, built through the real statements wherever one exists, so a factory cannot
produce a row the protocol could not. Only time travel (ageing a lease or a wake-up) uses the owner
connection, because no role may write the past."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from uuid import UUID

import psycopg

from app.store import export
from app.store.types import ExpectedFile, Status

LEASE = 60.0
#: Follows a ``WITH d AS (INSERT INTO destinations ... RETURNING id)``: the destination's first delivery
#: profile, in the same statement (the schema's deferred key wants both by the commit). '{}' reads as the
#: default profile.
DEFAULT_PROFILE_ROW = (" INSERT INTO delivery_profiles (destination_id, version, profile, created_by)"
                       " SELECT id, 1, '{}', 'tests' FROM d")


@dataclass(frozen=True)
class Job:
    id: UUID
    tenant_id: UUID
    destination_id: UUID
    delivery_key: str
    attempt_id: UUID | None = None


class Seeder:
    def __init__(self, conn: psycopg.Connection, admin: psycopg.Connection):
        self.conn = conn
        self.admin = admin

    def tenant(self, name: str = "Acme") -> UUID:
        tenant_id = uuid.uuid4()
        self.conn.execute("INSERT INTO tenants (id, name) VALUES (%s, %s)", (tenant_id, name))
        return tenant_id

    def destination(self, tenant_id: UUID, **caps) -> UUID:
        destination_id = uuid.uuid4()
        self.conn.execute(
            "WITH d AS (INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir, host_key,"
            " credential_ref, remote_hash, acknowledgments, name_and_size_identify, read_back)"
            " VALUES (%s, %s, 'partner', '127.0.0.1', 2222, 'partner', '/inbox', '[127.0.0.1]:2222 ssh-ed25519 AAAA',"
            " 'env:PARTNER_PASSWORD', %s, %s, %s, %s) RETURNING id)" + DEFAULT_PROFILE_ROW,
            (destination_id, tenant_id, caps.get("remote_hash", False), caps.get("acknowledgments", False),
             caps.get("name_and_size_identify", False), caps.get("read_back", False)))
        return destination_id

    def queued(self, tenant_id: UUID | None = None, destination_id: UUID | None = None) -> Job:
        tenant_id = tenant_id or self.tenant()
        destination_id = destination_id or self.destination(tenant_id)
        job = Job(uuid.uuid4(), tenant_id, destination_id, uuid.uuid4().hex)
        result = export.create(self.conn, job_id=job.id, tenant_id=tenant_id, destination_id=destination_id,
                             delivery_key=job.delivery_key, created_by="tests")
        assert result is export.CreateResult.CREATED
        return job

    def running(self, job: Job | None = None, *, lease_seconds: float = LEASE, version: int = 1) -> Job:
        job = job or self.queued()
        attempt_id = uuid.uuid4()
        assert export.try_claim(self.conn, job_id=job.id, checked_version=version, attempt_id=attempt_id,
                              worker_id="worker-test", lease_seconds=lease_seconds) == 1
        return Job(job.id, job.tenant_id, job.destination_id, job.delivery_key, attempt_id)

    def expected(self, job: Job, size: int = 123) -> ExpectedFile:
        return ExpectedFile(export.final_name(job.delivery_key), size, b"\x01" * 32)

    def delivering(self, job: Job | None = None, *, replaces_job_id: UUID | None = None) -> Job:
        job = job if job is not None and job.attempt_id else self.running(job)
        assert export.try_authorize_delivery(self.conn, job_id=job.id, tenant_id=job.tenant_id,
                                           attempt_id=job.attempt_id, expected=self.expected(job),
                                           replaces_job_id=replaces_job_id) == 1
        return job

    def finished(self, outcome: Status, job: Job | None = None, failure_reason=None) -> Job:
        job = self.delivering(job)
        assert export.try_finish_delivery(self.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="worker-test",
                                        outcome=outcome, failure_reason=failure_reason) == 1
        return job

    # --- time travel: only the owner may write the past --------------------------------------------

    @contextmanager
    def lease_expired(self, job: Job) -> Iterator[None]:
        """The lease expired, and what the block runs on ``self.conn`` (a takeover), in one transaction of
        the application's: a keeper renewing every fraction of a second waits on the row lock instead of
        landing between the two (under load one did, and the takeover matched nothing)."""
        with self.conn.transaction():
            self.conn.execute("UPDATE export_jobs SET lease_expires_at = clock_timestamp() - interval '1 second'"
                              " WHERE id = %s", (job.id,))
            yield

    def expire_lease(self, job: Job, seconds_ago: float = 1.0) -> None:
        self.admin.execute(
            "UPDATE export_jobs SET lease_expires_at = clock_timestamp() - make_interval(secs => %s) WHERE id = %s",
            (seconds_ago, job.id))

    def age_wakeup(self, job: Job, minutes: float) -> None:
        self.admin.execute(
            "UPDATE export_jobs SET woken_at = clock_timestamp() - make_interval(mins => %s) WHERE id = %s",
            (minutes, job.id))

    def status(self, job: Job) -> Status:
        row = self.admin.execute("SELECT status FROM export_jobs WHERE id = %s", (job.id,)).fetchone()
        return Status(row["status"])

    def row(self, job: Job) -> dict:
        return self.admin.execute("SELECT * FROM export_jobs WHERE id = %s", (job.id,)).fetchone()

    def events(self, job: Job) -> list[dict]:
        return self.admin.execute(
            "SELECT * FROM export_attempt_events WHERE job_id = %s ORDER BY id", (job.id,)).fetchall()

    def event_kinds(self, job: Job) -> list[str]:
        return [e["kind"] for e in self.events(job)]

    def outbox(self, job: Job) -> list[dict]:
        return self.admin.execute("SELECT * FROM outbox WHERE job_id = %s ORDER BY created_at", (job.id,)).fetchall()
