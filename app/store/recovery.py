"""Recovery's takeovers, reconciliation, correction and the sweeper, one function per statement.

The scan only nominates; each takeover repeats every condition the scan relied on, so each answers
True only when its own conditional write (and its event) committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg
from psycopg import errors as pg

from app.store.queries import QUERIES
from app.store.types import FailureCode, Status


@dataclass(frozen=True)
class ExpiredAttempt:
    """A nomination from the scan: an attempt whose lease had expired when the scan ran."""

    job_id: UUID
    tenant_id: UUID
    attempt_id: UUID
    status: Status
    stop_requested: bool
    attempt_count: int
    replaces_job_id: UUID | None
    expected_file_name: str | None
    expected_file_bytes: int | None
    expected_file_sha256: bytes | None
    destination_id: UUID


def scan_expired(conn: psycopg.Connection, *, batch_size: int = 100) -> list[ExpiredAttempt]:
    rows = conn.execute(QUERIES["recovery_scan_expired"], dict(batch_size=batch_size)).fetchall()
    return [
        ExpiredAttempt(
            job_id=r["id"], tenant_id=r["tenant_id"], attempt_id=r["attempt_id"], status=Status(r["status"]),
            stop_requested=r["stop_request_id"] is not None, attempt_count=r["attempt_count"],
            replaces_job_id=r["replaces_job_id"], expected_file_name=r["expected_file_name"],
            expected_file_bytes=r["expected_file_bytes"],
            expected_file_sha256=bytes(r["expected_file_sha256"]) if r["expected_file_sha256"] is not None else None,
            destination_id=r["destination_id"])
        for r in rows
    ]


def requeue_expired(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, max_attempts: int,
                    recovery_run_id: str) -> bool:
    return conn.execute(QUERIES["recovery_requeue_expired"], dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, max_attempts=max_attempts,
        recovery_run_id=recovery_run_id)).rowcount == 1


def stop_expired(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, recovery_run_id: str) -> bool:
    return conn.execute(QUERIES["recovery_stop_expired"], dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, recovery_run_id=recovery_run_id)).rowcount == 1


def exhaust_expired(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, max_attempts: int,
                    recovery_run_id: str) -> bool:
    return conn.execute(QUERIES["recovery_exhaust_expired"], dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, max_attempts=max_attempts,
        recovery_run_id=recovery_run_id)).rowcount == 1


def resolve_delivering(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, resolution: Status,
                       evidence_summary: str, recovery_run_id: str) -> bool:
    """Completed only when the caller holds evidence matching the expected file; otherwise
    OutcomeUnknown. Any other resolution matches nothing."""
    return conn.execute(QUERIES["recovery_resolve_delivering"], dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, resolution=resolution.value,
        evidence_summary=evidence_summary, recovery_run_id=recovery_run_id)).rowcount == 1


def reconcile(conn: psycopg.Connection, *, tenant_id: UUID, job_id: UUID, attempt_id: UUID, resolution: Status,
              evidence: str, reconciled_by: str) -> bool:
    """OutcomeUnknown -> Completed, or Failed with NotDelivered; once per attempt (a second time is
    refused by the unique index and answers False, with the row unchanged)."""
    return _once(conn, QUERIES["export_reconcile"], dict(
        tenant_id=tenant_id, job_id=job_id, attempt_id=attempt_id, resolution=resolution.value,
        evidence=evidence, reconciled_by=reconciled_by))


def correct(conn: psycopg.Connection, *, tenant_id: UUID, job_id: UUID, attempt_id: UUID, recorded_status: Status,
            corrected_status: Status, failure_reason: FailureCode | None, evidence_ref: str, why: str,
            corrected_by: str) -> bool:
    """A reconciliation operator's correction of a recorded Completed or Failed (the connection must
    run as exports_reconciler; any other role is refused by the database). Once per attempt: a
    second correction is refused by the unique index and answers False, with the row unchanged."""
    return _once(conn, QUERIES["export_correct"], dict(
        tenant_id=tenant_id, job_id=job_id, attempt_id=attempt_id, recorded_status=recorded_status.value,
        corrected_status=corrected_status.value, failure_reason=failure_reason.value if failure_reason else None,
        evidence_ref=evidence_ref, why=why, corrected_by=corrected_by))


def _once(conn: psycopg.Connection, statement: str, params: dict) -> bool:
    """A one-shot transition: its event's unique index refuses a second one, and the update rolls
    back with the refused event, so the refusal is an answer, not an error."""
    try:
        with conn.transaction():
            return conn.execute(statement, params).rowcount == 1
    except pg.UniqueViolation as exc:
        if exc.diag.constraint_name == "uq_attempt_transition":
            return False
        raise


def republish_due(conn: psycopg.Connection, *, sweep_after_seconds: float, batch_size: int = 500) -> list[UUID]:
    """One sweeper batch; returns the jobs that got a fresh wake-up."""
    rows = conn.execute(QUERIES["sweeper_republish_due"], dict(
        sweep_after_seconds=sweep_after_seconds, batch_size=batch_size)).fetchall()
    return [r["job_id"] for r in rows]
