"""Recording a cancellation request under a lock on this tenant's job row.

One short transaction: a lock timeout, one locking read, one lookup of the request id, at most one
update and one insert. Policy checks and notifications stay outside it (the stop NOTIFY is a trigger
that fires at commit). A lock timeout answers Busy with nothing recorded; a unique-violation race on
the request id is answered from the recorded row.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from app import logs
from app.store import connector, errors
from app.store.errors import ChangedUnderLock, Violation
from app.store.types import CancellationOutcome, CancellationReply, CancellationResult, Status

log = logs.get(__name__)

#: How long each statement of the transaction waits for the job's row lock before answering Busy.
LOCK_TIMEOUT = "2s"

_OUTCOME_BY_STATUS = {
    Status.QUEUED: CancellationOutcome.CANCELED_WHILE_QUEUED,
    Status.CANCELED: CancellationOutcome.ALREADY_CANCELED,
    Status.REJECTED: CancellationOutcome.ALREADY_ENDED,
    Status.STOPPED: CancellationOutcome.ALREADY_ENDED,
    Status.FAILED: CancellationOutcome.ALREADY_ENDED,
    # Delivery was authorized: the request is recorded, not obeyed.
    Status.DELIVERING: CancellationOutcome.TOO_LATE,
    Status.COMPLETED: CancellationOutcome.TOO_LATE,
    Status.OUTCOME_UNKNOWN: CancellationOutcome.TOO_LATE,
}


def classify(status: Status, stop_already_requested: bool) -> CancellationOutcome:
    if status is Status.RUNNING:
        if stop_already_requested:
            return CancellationOutcome.STOP_ALREADY_REQUESTED
        return CancellationOutcome.STOP_REQUESTED
    return _OUTCOME_BY_STATUS[status]


def request_cancellation(
    conn: psycopg.Connection, *, tenant_id: UUID, job_id: UUID, request_id: UUID, requested_by: str,
    reason: str | None = None, lock_timeout: str = LOCK_TIMEOUT,
) -> CancellationResult:
    """Decides and records one click. ``conn`` must be in autocommit mode; this opens its own
    transaction so a rolled-back attempt leaves nothing behind for the retry."""
    try:
        return _decide_and_record(conn, tenant_id, job_id, request_id, requested_by, reason, lock_timeout)
    except psycopg.OperationalError as exc:
        if not errors.lock_timeout(exc):
            raise
        # lock_timeout fired: this transaction decided and recorded nothing. An earlier submission with
        # the same id may have committed, so the client retries with the same id.
        log.info("cancellation.busy", job_id=job_id, request_id=request_id)
        return CancellationResult(CancellationReply.BUSY, request_id)
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is not Violation.REQUEST_ID_TAKEN:
            raise
        # The same (tenant, request id) committed first, most likely under another job's lock. Answer
        # from the recorded row, with the same job and operator check.
        with conn.transaction():
            earlier = _find(conn, tenant_id, request_id)
        if earlier is None:
            raise
        return _answer_for_earlier(earlier, job_id, requested_by, request_id)


def _decide_and_record(conn, tenant_id, job_id, request_id, requested_by, reason, lock_timeout) -> CancellationResult:
    with conn.transaction():
        connector.set_config(conn, "lock_timeout", lock_timeout, local=True)
        found = connector.fetch_one(conn, "cancellation_lock_job", dict(job_id=job_id, tenant_id=tenant_id))
        if found is None:
            # Another tenant's job looks exactly like a missing one; nothing is recorded against any job.
            log.info("cancellation.not_found", tenant_id=tenant_id, job_id=job_id, requested_by=requested_by)
            return CancellationResult(CancellationReply.NOT_FOUND, request_id)

        # Checked under the lock, so two submissions of one click are serialized here. The first
        # reason stands: a retry with another reason is still the same request.
        earlier = _find(conn, tenant_id, request_id)
        if earlier is not None:
            return _answer_for_earlier(earlier, job_id, requested_by, request_id)

        status = Status(found["status"])
        outcome = classify(status, found["stop_request_id"] is not None)
        keys = dict(job_id=job_id, tenant_id=tenant_id, request_id=request_id)
        if outcome is CancellationOutcome.CANCELED_WHILE_QUEUED:
            changed = connector.execute(conn, "cancellation_cancel_queued", keys)
        elif outcome is CancellationOutcome.STOP_REQUESTED:
            changed = connector.execute(conn, "cancellation_request_stop", keys)
        else:
            changed = 1   # these outcomes change nothing on the job
        if changed != 1:
            log.critical("cancellation.changed_under_lock", job_id=job_id, outcome=outcome.value)
            raise ChangedUnderLock(f"export {job_id} changed under its row lock")

        inserted = connector.execute(conn, "cancellation_record", dict(
            tenant_id=tenant_id, request_id=request_id, job_id=job_id, requested_by=requested_by,
            reason=reason, outcome=outcome.value, found_status=status.value,
            found_attempt_id=found["attempt_id"], found_attempt_count=found["attempt_count"],
            found_delivery_authorized_at=found["delivery_authorized_at"]))
        if inserted != 1:
            raise ChangedUnderLock(f"cancellation request {request_id} was not recorded")
    return CancellationResult(
        CancellationReply.RECORDED, request_id, outcome, found_status=status,
        found_attempt_id=found["attempt_id"], found_attempt_count=found["attempt_count"],
        found_delivery_authorized_at=found["delivery_authorized_at"])


def _find(conn: psycopg.Connection, tenant_id: UUID, request_id: UUID) -> dict[str, Any] | None:
    return connector.fetch_one(conn, "cancellation_find_request", dict(tenant_id=tenant_id, request_id=request_id))


def _answer_for_earlier(earlier: dict[str, Any], job_id: UUID, requested_by: str,
                        request_id: UUID) -> CancellationResult:
    if earlier["job_id"] != job_id or earlier["requested_by"] != requested_by:
        # A client error; it says nothing about the other request.
        return CancellationResult(CancellationReply.REQUEST_ID_REUSED, request_id)
    return CancellationResult(
        CancellationReply.RECORDED, request_id, CancellationOutcome(earlier["outcome"]),
        found_status=Status(earlier["found_status"]), found_attempt_id=earlier["found_attempt_id"],
        found_attempt_count=earlier["found_attempt_count"],
        found_delivery_authorized_at=earlier["found_delivery_authorized_at"], replay_of=earlier["recorded_at"])
