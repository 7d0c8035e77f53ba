"""Recovery's scan, its four takeovers and its reads of evidence, one function per statement.

The scan only nominates; each takeover repeats every condition the scan relied on, so each answers
True only when its own conditional write (and its event) committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg

from app.store import connector
from app.store.types import Status


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
    rows = connector.fetch_all(conn, "recovery_scan_expired", dict(batch_size=batch_size))
    return [
        ExpiredAttempt(
            job_id=r["id"], tenant_id=r["tenant_id"], attempt_id=r["attempt_id"], status=Status(r["status"]),
            stop_requested=r["stop_request_id"] is not None, attempt_count=r["attempt_count"],
            replaces_job_id=r["replaces_job_id"], expected_file_name=r["expected_file_name"],
            expected_file_bytes=r["expected_file_bytes"],
            expected_file_sha256=_bytes(r["expected_file_sha256"]),
            destination_id=r["destination_id"])
        for r in rows
    ]


def requeue_expired(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, max_attempts: int,
                    recovery_run_id: str) -> bool:
    return connector.execute(conn, "recovery_requeue_expired", dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, max_attempts=max_attempts,
        recovery_run_id=recovery_run_id)) == 1


def stop_expired(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, recovery_run_id: str) -> bool:
    return connector.execute(conn, "recovery_stop_expired", dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, recovery_run_id=recovery_run_id)) == 1


def exhaust_expired(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, max_attempts: int,
                    recovery_run_id: str) -> bool:
    return connector.execute(conn, "recovery_exhaust_expired", dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, max_attempts=max_attempts,
        recovery_run_id=recovery_run_id)) == 1


def resolve_delivering(conn: psycopg.Connection, *, job_id: UUID, expired_attempt_id: UUID, resolution: Status,
                       evidence_summary: str, recovery_run_id: str) -> bool:
    """Completed only when the caller holds evidence matching the expected file; otherwise
    OutcomeUnknown. Any other resolution matches nothing."""
    return connector.execute(conn, "recovery_resolve_delivering", dict(
        job_id=job_id, expired_attempt_id=expired_attempt_id, resolution=resolution.value,
        evidence_summary=evidence_summary, recovery_run_id=recovery_run_id)) == 1


def evidence_details(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID) -> list[str | None]:
    """The details of the attempt's DeliveryEvidence events, in the order they were appended."""
    rows = connector.fetch_all(conn, "recovery_read_evidence", dict(job_id=job_id, attempt_id=attempt_id))
    return [r["detail"] for r in rows]


@dataclass(frozen=True)
class UnknownOutcome:
    """An OutcomeUnknown job, as reconciliation from evidence needs it."""

    job_id: UUID
    tenant_id: UUID
    attempt_id: UUID | None
    replaces_job_id: UUID | None
    expected_file_name: str | None
    expected_file_bytes: int | None
    expected_file_sha256: bytes | None


def scan_outcome_unknown(conn: psycopg.Connection, *, after: UUID | None, batch_size: int) -> list[UnknownOutcome]:
    """One page of OutcomeUnknown jobs after ``after`` (by id)."""
    rows = connector.fetch_all(conn, "recovery_scan_outcome_unknown", dict(after=after, batch_size=batch_size))
    return [UnknownOutcome(job_id=r["id"], tenant_id=r["tenant_id"], attempt_id=r["attempt_id"],
                           replaces_job_id=r["replaces_job_id"], expected_file_name=r["expected_file_name"],
                           expected_file_bytes=r["expected_file_bytes"],
                           expected_file_sha256=_bytes(r["expected_file_sha256"]))
            for r in rows]


def _bytes(value: object) -> bytes | None:
    return bytes(value) if value is not None else None  # type: ignore[arg-type]
