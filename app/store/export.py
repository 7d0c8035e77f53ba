"""The job's conditional writes, one function per named statement, and the lost-response wrappers.

Every function takes the connection first and answers with a value: "matched no row" is an answer,
never an exception. The wrappers (``claim``, ``authorize_delivery``, the terminal writes) settle a
lost response by re-reading state and ownership together on a fresh connection.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from uuid import UUID

import psycopg
from psycopg_pool import PoolTimeout

from app import logs
from app.store import connector, errors
from app.store.database import Database
from app.store.errors import Violation
from app.store.types import (
    AuthorizationResult,
    ClaimResult,
    DeferResult,
    EditOutcome,
    EditResult,
    ExpectedFile,
    FailureCause,
    FailureCode,
    Ownership,
    RenewResult,
    ReplacementResult,
    ScheduleSlot,
    Status,
    WriteResult,
)

log = logs.get(__name__)

#: Seconds a lost-response re-read may take before the answer is Unknown.
REREAD_TIMEOUT_SECONDS = 5


def final_name(delivery_key: str) -> str:
    """The file name the default delivery profile renders for a key (``contacts-<key>.csv``). The name an
    export delivers under is the one stored with its key when it was created (``deliveries.file_name``),
    so a replacement, which carries the key forward, targets the same name."""
    return f"contacts-{delivery_key}.csv"


class CreateResult(enum.Enum):
    CREATED = "Created"
    KEY_TAKEN = "KeyTaken"                  # the tenant already has a delivery with this key
    UNKNOWN_DESTINATION = "UnknownDestination"   # no such destination in this tenant


# --- creation and terms ------------------------------------------------------------------------


def create(
    conn: psycopg.Connection, *, job_id: UUID, tenant_id: UUID, destination_id: UUID, delivery_key: str,
    created_by: str, file_name: str | None = None, slot: ScheduleSlot | None = None,
) -> CreateResult:
    """Creates an original job. ``file_name`` is what its profile rendered (``app.delivery.naming``);
    without one, the default profile's name. ``slot``: a schedule's, whose row the same transaction writes."""
    params = dict(job_id=job_id, tenant_id=tenant_id, destination_id=destination_id,
                  delivery_key=delivery_key, created_by=created_by,
                  file_name=file_name if file_name is not None else final_name(delivery_key),
                  schedule_id=slot.schedule_id if slot else None, schedule_slot=slot.slot if slot else None,
                  incremental=bool(slot and slot.incremental), incremental_since=slot.since if slot else None)
    try:
        with conn.transaction():
            rows = connector.fetch_all(conn, "export_create", params)
    except psycopg.IntegrityError as exc:
        match errors.violation(exc):
            case Violation.KEY_TAKEN:
                return CreateResult.KEY_TAKEN
            case Violation.UNKNOWN_DESTINATION:
                return CreateResult.UNKNOWN_DESTINATION
        raise
    if len(rows) != 1:
        raise errors.StoreError(f"export_create wrote {len(rows)} outbox rows for one job")
    return CreateResult.CREATED


def create_replacement(
    conn: psycopg.Connection, *, job_id: UUID, tenant_id: UUID, original_job_id: UUID, created_by: str,
    replacement_reason: str, overwrite_agreement_ref: str | None = None,
) -> ReplacementResult:
    """Creates a replacement for a named person, or nothing when the original may not be replaced.
    The caller resolves a replacement's id to its original first (``original_of``)."""
    params = dict(job_id=job_id, tenant_id=tenant_id, original_job_id=original_job_id, created_by=created_by,
                  replacement_reason=replacement_reason, overwrite_agreement_ref=overwrite_agreement_ref)
    try:
        with conn.transaction():
            rows = connector.fetch_all(conn, "export_create_replacement", params)
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is Violation.REPLACEMENT_SLOT_TAKEN:
            return ReplacementResult.SLOT_TAKEN
        raise
    return ReplacementResult.CREATED if len(rows) == 1 else ReplacementResult.NOT_ALLOWED


def edit_terms(
    conn: psycopg.Connection, *, tenant_id: UUID, job_id: UUID, expected_version: int, destination_id: UUID,
) -> EditOutcome:
    params = dict(tenant_id=tenant_id, job_id=job_id, expected_version=expected_version,
                  destination_id=destination_id)
    try:
        with conn.transaction():
            row = connector.fetch_one(conn, "export_edit_terms", params)
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is Violation.UNKNOWN_DESTINATION:
            return EditOutcome(EditResult.NOT_CHANGED)
        raise
    if row is None:
        return EditOutcome(EditResult.NOT_CHANGED)
    return EditOutcome(EditResult.CHANGED, version=row["version"])


def reject(conn: psycopg.Connection, *, job_id: UUID, checked_version: int) -> bool:
    """Queued -> Rejected for the evaluated version; False when the job moved on or was edited."""
    return connector.execute(conn, "export_reject", dict(job_id=job_id, checked_version=checked_version)) == 1


# --- reads for the wrappers ----------------------------------------------------------------------


def read_ownership(conn: psycopg.Connection, *, job_id: UUID) -> Ownership | None:
    row = connector.fetch_one(conn, "export_read_ownership", dict(job_id=job_id))
    if row is None:
        return None
    return Ownership(
        status=Status(row["status"]),
        attempt_id=row["attempt_id"],
        stop_requested=row["stop_request_id"] is not None,
        lease_current=row["lease_current"],
        original_status=Status(row["original_status"]) if row["original_status"] else None,
    )


#: The re-read did not answer either: only recovery, later, can tell which side of the write we are on.
_UNANSWERED = object()


def _reread(db: Database, job_id: UUID):
    """State and ownership on a fresh connection, bounded in time; ``_UNANSWERED`` when the database
    does not answer (a shutdown must not hang here with the database unreachable)."""
    try:
        with db.connection(timeout=REREAD_TIMEOUT_SECONDS) as conn:
            connector.set_config(conn, "statement_timeout", f"{REREAD_TIMEOUT_SECONDS}s", local=False)
            try:
                return read_ownership(conn, job_id=job_id)
            finally:
                if not conn.broken:
                    connector.reset(conn, "statement_timeout")
    except Exception as exc:
        if errors.outcome_unknown(exc) or isinstance(exc, PoolTimeout):
            return _UNANSWERED
        raise


def _attempt(db: Database, statement: Callable[[psycopg.Connection], int]) -> int | None:
    """Runs one write; None when its response was lost and only the row can say what happened."""
    try:
        with db.connection() as conn:
            return statement(conn)
    except Exception as exc:
        if errors.outcome_unknown(exc) or errors.retryable(exc):
            log.warning("store.response_lost", error=type(exc).__name__)
            return None
        raise


# --- cutoff 1 ------------------------------------------------------------------------------------


def try_claim(
    conn: psycopg.Connection, *, job_id: UUID, checked_version: int, attempt_id: UUID, worker_id: str,
    lease_seconds: float,
) -> int:
    return connector.execute(conn, "export_claim", dict(
        job_id=job_id, checked_version=checked_version, attempt_id=attempt_id, worker_id=worker_id,
        lease_seconds=lease_seconds))


def claim(
    db: Database, *, job_id: UUID, checked_version: int, attempt_id: UUID, worker_id: str, lease_seconds: float,
) -> ClaimResult:
    """Cutoff 1 with its lost-response rule: Running with this attempt's id, and nothing else, means
    claimed; if the re-read fails too, Unknown (the caller leaves the message unsettled)."""
    inserted = _attempt(db, lambda conn: try_claim(
        conn, job_id=job_id, checked_version=checked_version, attempt_id=attempt_id, worker_id=worker_id,
        lease_seconds=lease_seconds))
    if inserted == 1:
        return ClaimResult.CLAIMED
    row = _reread(db, job_id)
    if row is _UNANSWERED:
        return ClaimResult.UNKNOWN
    owned = row is not None and row.status is Status.RUNNING and row.attempt_id == attempt_id
    return ClaimResult.CLAIMED if owned else ClaimResult.LOST


# --- cutoff 2 ------------------------------------------------------------------------------------


def _transitions(name: str, row: dict[str, object] | None, evidence: Sequence[str]) -> int:
    """How many transitions a statement that also appends ``evidence`` made, its evidence count checked:
    every detail is appended when the job exists (whoever owns it), none when it does not."""
    assert row is not None   # an aggregate always answers one row
    transitions, appended = int(row["transitions"]), int(row["evidence"])  # type: ignore[call-overload]
    if appended not in (0, len(evidence)) or (transitions and appended != len(evidence)):
        raise errors.StoreError(f"{name} appended {appended} of {len(evidence)} evidence rows")
    return transitions


def try_authorize_delivery(
    conn: psycopg.Connection, *, job_id: UUID, tenant_id: UUID, attempt_id: UUID, expected: ExpectedFile,
    replaces_job_id: UUID | None, evidence: Sequence[str] = (), observed_by: str | None = None,
    profile_version: int | None = None, delivery_mode: str = "standard",
) -> int:
    """Cutoff 2, appending the evidence gathered before it (the baseline) in the same statement, and
    recording the profile version the file was built with and the delivery mode it is published in."""
    row = connector.fetch_one(conn, "export_authorize_delivery", dict(
        job_id=job_id, tenant_id=tenant_id, attempt_id=attempt_id, replaces_job_id=replaces_job_id,
        final_name=expected.name, length=expected.size, sha256=expected.sha256, evidence=list(evidence),
        observed_by=observed_by, profile_version=profile_version, marker_name=expected.marker_name,
        marker=expected.marker, snapshot=expected.snapshot, delivery_mode=delivery_mode))
    return _transitions("export_authorize_delivery", row, evidence)


def authorize_delivery(
    db: Database, *, job_id: UUID, tenant_id: UUID, attempt_id: UUID, expected: ExpectedFile,
    replaces_job_id: UUID | None, evidence: Sequence[str] = (), observed_by: str | None = None,
    profile_version: int | None = None, delivery_mode: str = "standard",
) -> AuthorizationResult:
    """Cutoff 2. On 0 or a lost response, the re-read says why delivery was refused. Authorized means the
    evidence was appended too (the same statement committed)."""
    inserted = _attempt(db, lambda conn: try_authorize_delivery(
        conn, job_id=job_id, tenant_id=tenant_id, attempt_id=attempt_id, expected=expected,
        replaces_job_id=replaces_job_id, evidence=evidence, observed_by=observed_by,
        profile_version=profile_version, delivery_mode=delivery_mode))
    if inserted == 1:
        return AuthorizationResult.AUTHORIZED
    row = _reread(db, job_id)
    if row is _UNANSWERED:
        return AuthorizationResult.UNKNOWN
    return classify_refusal(row, attempt_id)


def classify_refusal(row: Ownership | None, attempt_id: UUID) -> AuthorizationResult:
    """Why cutoff 2 did not (visibly) commit, from a re-read that is not atomic with it."""
    if row is None or row.attempt_id != attempt_id:
        return AuthorizationResult.NOT_OWNER
    if row.status is Status.DELIVERING:
        return AuthorizationResult.AUTHORIZED     # a lost response to a write that committed
    if row.status is not Status.RUNNING:
        return AuthorizationResult.NOT_OWNER
    if row.stop_requested:
        return AuthorizationResult.STOP_RECORDED
    if row.original_status is Status.COMPLETED:
        return AuthorizationResult.ORIGINAL_COMPLETED
    # Expired, or renewed between the refusal and this read: either way one renewal and one retry.
    return AuthorizationResult.LEASE_LAPSED


# --- the lease -----------------------------------------------------------------------------------


def renew_lease(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID, lease_seconds: float) -> RenewResult:
    rows = connector.execute(conn, "export_lease_renew", dict(
        job_id=job_id, attempt_id=attempt_id, lease_seconds=lease_seconds))
    return RenewResult.RENEWED if rows == 1 else RenewResult.LOST


# --- terminal writes -----------------------------------------------------------------------------


def try_finish_stopped(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID, worker_id: str,
                       stop_point: str) -> int:
    return connector.execute(conn, "export_finish_stopped", dict(
        job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, stop_point=stop_point))


def try_finish_failed(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID, worker_id: str,
                      failure_reason: FailureCode, detail: str | None = None,
                      cause: FailureCause | None = None) -> int:
    return connector.execute(conn, "export_finish_failed", dict(
        job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, failure_reason=failure_reason.value,
        detail=detail, cause=cause.value if cause else None))


def try_finish_delivery(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID, worker_id: str,
                        outcome: Status, failure_reason: FailureCode | None = None,
                        detail: str | None = None, cause: FailureCause | None = None,
                        evidence: Sequence[str] = (), observed_by: str | None = None) -> int:
    """The delivering attempt's terminal write, appending what it observed after cutoff 2 and its outcome
    in the same statement, whether or not the write matches."""
    row = connector.fetch_one(conn, "export_finish_delivery", dict(
        job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, outcome=outcome.value,
        failure_reason=failure_reason.value if failure_reason else None, detail=detail,
        cause=cause.value if cause else None, evidence=list(evidence), observed_by=observed_by))
    return _transitions("export_finish_delivery", row, evidence)


def _confirm_terminal(db: Database, job_id: UUID, attempt_id: UUID, expected: Status,
                      write: Callable[[psycopg.Connection], int]) -> WriteResult:
    """A terminal write and, if its answer was lost, a re-read confirming the expected terminal state
    with this attempt's id. A repeated call cannot add a second event: the state no longer matches."""
    inserted = _attempt(db, write)
    if inserted == 1:
        return WriteResult.WRITTEN
    row = _reread(db, job_id)
    if row is _UNANSWERED:
        return WriteResult.UNKNOWN
    if inserted is None and row is not None and row.attempt_id == attempt_id and row.status is expected:
        return WriteResult.WRITTEN
    return WriteResult.NOT_MATCHED


def finish_stopped(db: Database, *, job_id: UUID, attempt_id: UUID, worker_id: str, stop_point: str) -> WriteResult:
    return _confirm_terminal(db, job_id, attempt_id, Status.STOPPED, lambda conn: try_finish_stopped(
        conn, job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, stop_point=stop_point))


def finish_failed(db: Database, *, job_id: UUID, attempt_id: UUID, worker_id: str, failure_reason: FailureCode,
                  detail: str | None = None, cause: FailureCause | None = None) -> WriteResult:
    """Running -> Failed; NOT_MATCHED when a stop request was recorded first (or the attempt ended)."""
    return _confirm_terminal(db, job_id, attempt_id, Status.FAILED, lambda conn: try_finish_failed(
        conn, job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, failure_reason=failure_reason,
        detail=detail, cause=cause))


def finish_delivery(db: Database, *, job_id: UUID, attempt_id: UUID, worker_id: str, outcome: Status,
                    failure_reason: FailureCode | None = None, detail: str | None = None,
                    cause: FailureCause | None = None, evidence: Sequence[str] = (),
                    observed_by: str | None = None) -> WriteResult:
    return _confirm_terminal(db, job_id, attempt_id, outcome, lambda conn: try_finish_delivery(
        conn, job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, outcome=outcome,
        failure_reason=failure_reason, detail=detail, cause=cause, evidence=evidence, observed_by=observed_by))


# --- deferral: the partner could not be reached before cutoff 2 --------------------------------


def try_defer(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID, worker_id: str, cause: str,
              delay_seconds: float) -> int:
    return connector.execute(conn, "export_defer", dict(
        job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, cause=cause, delay_seconds=delay_seconds))


def defer(db: Database, *, job_id: UUID, attempt_id: UUID, worker_id: str, cause: str,
          delay_seconds: float) -> DeferResult:
    """Running -> Queued with a wake-up due in ``delay_seconds``. On 0 or a lost response, the re-read
    says why not: a deferral that committed without an answer leaves the job Queued with no attempt,
    which this attempt cannot tell from a takeover, and either way it owns nothing any more."""
    inserted = _attempt(db, lambda conn: try_defer(
        conn, job_id=job_id, attempt_id=attempt_id, worker_id=worker_id, cause=cause, delay_seconds=delay_seconds))
    if inserted == 1:
        return DeferResult.DEFERRED
    row = _reread(db, job_id)
    if row is _UNANSWERED:
        return DeferResult.UNKNOWN
    if row is None or row.attempt_id != attempt_id or row.status is not Status.RUNNING:
        return DeferResult.NOT_OWNER
    if row.stop_requested:
        return DeferResult.STOP_RECORDED
    return DeferResult.LEASE_LAPSED


# --- evidence ------------------------------------------------------------------------------------


def append_evidence(conn: psycopg.Connection, *, job_id: UUID, attempt_id: UUID, observed_by: str,
                    detail: str) -> bool:
    """Appends delivery evidence with its provenance; it cannot change the job's status."""
    return connector.execute(conn, "export_append_evidence", dict(
        job_id=job_id, attempt_id=attempt_id, observed_by=observed_by, detail=detail)) == 1


# --- after recovery: reconciliation and correction --------------------------------------------


def reconcile(conn: psycopg.Connection, *, tenant_id: UUID, job_id: UUID, attempt_id: UUID, resolution: Status,
              evidence: str, reconciled_by: str) -> bool:
    """OutcomeUnknown -> Completed, or Failed with NotDelivered; once per attempt (a second time is
    refused by the unique index and answers False, with the row unchanged)."""
    return _once(conn, lambda: connector.execute(conn, "export_reconcile", dict(
        tenant_id=tenant_id, job_id=job_id, attempt_id=attempt_id, resolution=resolution.value,
        evidence=evidence, reconciled_by=reconciled_by)))


def correct(conn: psycopg.Connection, *, tenant_id: UUID, job_id: UUID, attempt_id: UUID, recorded_status: Status,
            corrected_status: Status, failure_reason: FailureCode | None, evidence_ref: str, why: str,
            corrected_by: str) -> bool:
    """A reconciliation operator's correction of a recorded Completed or Failed (the connection must
    run as exports_reconciler; any other role is refused by the database). Once per attempt: a
    second correction is refused by the unique index and answers False, with the row unchanged."""
    return _once(conn, lambda: connector.execute(conn, "export_correct", dict(
        tenant_id=tenant_id, job_id=job_id, attempt_id=attempt_id, recorded_status=recorded_status.value,
        corrected_status=corrected_status.value, failure_reason=failure_reason.value if failure_reason else None,
        evidence_ref=evidence_ref, why=why, corrected_by=corrected_by)))


def _once(conn: psycopg.Connection, write: Callable[[], int]) -> bool:
    """A one-shot transition: its event's unique index refuses a second one, and the update rolls
    back with the refused event, so the refusal is an answer, not an error."""
    try:
        with conn.transaction():
            return write() == 1
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is Violation.TRANSITION_RECORDED:
            return False
        raise
