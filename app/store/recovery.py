"""Recovery's scan, its four takeovers and its reads of evidence, one function per statement.

The scan only nominates; each takeover repeats every condition the scan relied on, so each answers
True only when its own conditional write (and its event) committed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
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
    #: Claims that ended in a deferral: they do not count toward the attempt cap.
    deferrals: int
    replaces_job_id: UUID | None
    expected_file_name: str | None
    expected_file_bytes: int | None
    expected_file_sha256: bytes | None
    destination_id: UUID
    #: The completion marker cutoff 2 recorded, if the profile writes one.
    expected_marker_name: str | None = None
    expected_marker: bytes | None = None
    #: The delivery mode cutoff 2 recorded (``app.delivery.modes``); None before it was recorded: standard.
    expected_delivery_mode: str | None = None


def scan_expired(conn: psycopg.Connection, *, batch_size: int = 100) -> list[ExpiredAttempt]:
    rows = connector.fetch_all(conn, "recovery_scan_expired", dict(batch_size=batch_size))
    return [
        ExpiredAttempt(
            job_id=r["id"], tenant_id=r["tenant_id"], attempt_id=r["attempt_id"], status=Status(r["status"]),
            stop_requested=r["stop_request_id"] is not None, attempt_count=r["attempt_count"],
            deferrals=r["deferrals"], replaces_job_id=r["replaces_job_id"], expected_file_name=r["expected_file_name"],
            expected_file_bytes=r["expected_file_bytes"],
            expected_file_sha256=_bytes(r["expected_file_sha256"]),
            destination_id=r["destination_id"], expected_marker_name=r["expected_marker_name"],
            expected_marker=_bytes(r["expected_marker"]), expected_delivery_mode=r["expected_delivery_mode"])
        for r in rows
    ]


#: One nomination: the job and the attempt whose lease the scan saw expired.
Nomination = tuple[UUID, UUID]


def _nominations(nominated: Sequence[Nomination]) -> dict[str, list[UUID]]:
    return dict(job_ids=[job for job, _ in nominated], attempt_ids=[attempt for _, attempt in nominated])


def requeue_expired(conn: psycopg.Connection, nominated: Sequence[Nomination], *, max_attempts: int,
                    recovery_run_id: str) -> list[UUID]:
    """Requeues each nominated attempt that is still Running, unstopped, under the cap and expired;
    returns the jobs requeued (each with its event and a new wake-up)."""
    rows = connector.fetch_all(conn, "recovery_requeue_expired", dict(
        _nominations(nominated), max_attempts=max_attempts, recovery_run_id=recovery_run_id))
    return [r["job_id"] for r in rows]


def stop_expired(conn: psycopg.Connection, nominated: Sequence[Nomination], *, recovery_run_id: str) -> list[UUID]:
    """Stops each nominated attempt that is still Running, expired and has a recorded stop request."""
    rows = connector.fetch_all(conn, "recovery_stop_expired", dict(
        _nominations(nominated), recovery_run_id=recovery_run_id))
    return [r["job_id"] for r in rows]


def exhaust_expired(conn: psycopg.Connection, nominated: Sequence[Nomination], *, max_attempts: int,
                    recovery_run_id: str) -> list[UUID]:
    """Fails (AttemptsExhausted) each nominated attempt still Running, unstopped and expired at the cap."""
    rows = connector.fetch_all(conn, "recovery_exhaust_expired", dict(
        _nominations(nominated), max_attempts=max_attempts, recovery_run_id=recovery_run_id))
    return [r["job_id"] for r in rows]


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
    #: The id of the attempt's newest event: its evidence is unchanged while this is.
    last_event_id: int | None = None
    expected_marker_name: str | None = None
    expected_marker: bytes | None = None
    #: Where reconciliation finishes a missing completion marker.
    destination_id: UUID | None = None
    expected_delivery_mode: str | None = None


def scan_outcome_unknown(conn: psycopg.Connection, *, after: UUID | None, batch_size: int) -> list[UnknownOutcome]:
    """One page of OutcomeUnknown jobs after ``after`` (by id)."""
    rows = connector.fetch_all(conn, "recovery_scan_outcome_unknown", dict(after=after, batch_size=batch_size))
    return [UnknownOutcome(job_id=r["id"], tenant_id=r["tenant_id"], attempt_id=r["attempt_id"],
                           replaces_job_id=r["replaces_job_id"], expected_file_name=r["expected_file_name"],
                           expected_file_bytes=r["expected_file_bytes"],
                           expected_file_sha256=_bytes(r["expected_file_sha256"]), last_event_id=r["last_event_id"],
                           expected_marker_name=r["expected_marker_name"], expected_marker=_bytes(r["expected_marker"]),
                           destination_id=r["destination_id"], expected_delivery_mode=r["expected_delivery_mode"])
            for r in rows]


def _bytes(value: Any) -> bytes | None:
    return bytes(value) if value is not None else None


#: The advisory-lock class of inspection claims (the key's first half; the attempt's hash is the second).
INSPECTION_LOCK_CLASS = 0x65787069   # "expi"


class InspectionClaim(enum.Enum):
    CLAIMED = "Claimed"              # this session holds it, and the attempt still needs it
    HELD_ELSEWHERE = "HeldElsewhere"  # another scheduler is inspecting it now
    MOVED_ON = "MovedOn"             # no longer an expired delivery: renewed, finished or resolved since the scan


def claim_inspection(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID) -> InspectionClaim:
    """Takes the attempt's inspection for this session. When CLAIMED, hold ``conn`` until the resolution
    is written, then ``release_inspection``; otherwise nothing is held."""
    key = dict(lock_class=INSPECTION_LOCK_CLASS, attempt_id=attempt_id)
    if not connector.fetch_one(conn, "recovery_claim_inspection", key)["claimed"]:  # type: ignore[index]
        return InspectionClaim.HELD_ELSEWHERE
    row = connector.fetch_one(conn, "recovery_still_expired_delivering", dict(job_id=job_id, attempt_id=attempt_id))
    if row is not None and row["expired"]:
        return InspectionClaim.CLAIMED
    release_inspection(conn, attempt_id=attempt_id)
    return InspectionClaim.MOVED_ON


def release_inspection(conn: psycopg.Connection, *, attempt_id: UUID) -> None:
    connector.fetch_one(conn, "recovery_release_inspection",
                        dict(lock_class=INSPECTION_LOCK_CLASS, attempt_id=attempt_id))
