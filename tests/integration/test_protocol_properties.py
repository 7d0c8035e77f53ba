"""Any interleaving of the protocol's writers on one job keeps the reference's invariants.

Hypothesis draws sequences of writes from every writer of the job row (claims by current and stale
workers, cutoff 2, renewals, lease expiry, cancellations, recovery's takeovers, terminal writes,
deferrals, terms edits, reconciliation) and runs them through the real statements against the real
database.
After every step the row and its history must agree:

- the status changed only along a transition in docs/protocol.md;
- each attempt has at most one Claimed event, and the claims counted equal attempt_count;
- a status reached by an attempt event has that event (Running: Claimed; Delivering:
  DeliveryAuthorized; Stopped by the worker or by recovery; ...);
- a stop request recorded before cutoff 2 is never followed by that attempt's authorization;
- every time the job (re)entered Queued, a new outbox row was written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.store import cancellation, export, recovery
from app.store.types import FailureCode, Status
from tests.factories import Job

MAX_ATTEMPTS = 3

ALLOWED = {
    (Status.QUEUED, Status.RUNNING), (Status.QUEUED, Status.CANCELED), (Status.QUEUED, Status.REJECTED),
    (Status.RUNNING, Status.DELIVERING), (Status.RUNNING, Status.STOPPED), (Status.RUNNING, Status.FAILED),
    (Status.RUNNING, Status.QUEUED),
    (Status.DELIVERING, Status.COMPLETED), (Status.DELIVERING, Status.FAILED),
    (Status.DELIVERING, Status.OUTCOME_UNKNOWN),
    (Status.OUTCOME_UNKNOWN, Status.COMPLETED), (Status.OUTCOME_UNKNOWN, Status.FAILED),
}

# The event that proves each status reached by an attempt (any of them).
PROOF = {
    Status.RUNNING: {"Claimed"},
    Status.DELIVERING: {"DeliveryAuthorized"},
    Status.STOPPED: {"Stopped", "StoppedByRecovery"},
    Status.FAILED: {"Failed", "Finished", "AttemptsExhausted", "Reconciled"},
    Status.COMPLETED: {"Finished", "ResolvedByRecovery", "Reconciled"},
    Status.OUTCOME_UNKNOWN: {"Finished", "ResolvedByRecovery"},
}

# The writers that race at the cutoffs are drawn more often, so short sequences reach the races.
OPERATIONS = (
    ["claim", "authorize", "cancel"] * 3 + ["expire", "recover", "renew"] * 2
    + ["claim_stale_version", "finish_stopped", "finish_failed", "finish_completed", "finish_unknown", "edit",
       "reconcile", "reject", "defer"]
)

STEPS = st.lists(st.tuples(
    st.sampled_from(OPERATIONS),
    st.integers(min_value=0, max_value=2),   # which attempt: 0 is the newest, higher are stale workers
), min_size=2, max_size=14)


@dataclass
class Model:
    job: Job
    version: int = 1
    attempts: list[uuid.UUID] = field(default_factory=list)
    queued_entries: int = 1   # creation

    def attempt(self, back: int) -> uuid.UUID:
        if not self.attempts:
            return uuid.uuid4()   # a worker that never claimed anything
        return self.attempts[max(0, len(self.attempts) - 1 - back)]


def _step(seed, model: Model, op: str, back: int) -> None:
    conn, job = seed.conn, model.job
    attempt = model.attempt(back)
    if op in ("claim", "claim_stale_version"):
        new = uuid.uuid4()
        version = model.version if op == "claim" else model.version - 1
        if export.try_claim(conn, job_id=job.id, checked_version=version, attempt_id=new, worker_id="w",
                          lease_seconds=60) == 1:
            model.attempts.append(new)
    elif op == "authorize":
        expected = seed.expected(job)
        export.try_authorize_delivery(conn, job_id=job.id, tenant_id=job.tenant_id, attempt_id=attempt,
                                    expected=expected, replaces_job_id=None)
    elif op == "renew":
        export.renew_lease(conn, job_id=job.id, attempt_id=attempt, lease_seconds=60)
    elif op == "expire":
        seed.expire_lease(job)
    elif op == "cancel":
        cancellation.request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(),
                                          requested_by="dana")
    elif op == "recover":
        for expired in recovery.scan_expired(conn):
            if expired.job_id != job.id:
                continue
            if expired.status is Status.DELIVERING:
                recovery.resolve_delivering(conn, job_id=job.id, expired_attempt_id=expired.attempt_id,
                                            resolution=Status.OUTCOME_UNKNOWN, evidence_summary="none",
                                            recovery_run_id="r")
            elif expired.stop_requested:
                recovery.stop_expired(conn, [(job.id, expired.attempt_id)], recovery_run_id="r")
            elif recovery.requeue_expired(conn, [(job.id, expired.attempt_id)],
                                          max_attempts=MAX_ATTEMPTS, recovery_run_id="r"):
                model.queued_entries += 1
            else:
                recovery.exhaust_expired(conn, [(job.id, expired.attempt_id)],
                                         max_attempts=MAX_ATTEMPTS, recovery_run_id="r")
    elif op == "finish_stopped":
        export.try_finish_stopped(conn, job_id=job.id, attempt_id=attempt, worker_id="w", stop_point="WhileBuilding")
    elif op == "finish_failed":
        export.try_finish_failed(conn, job_id=job.id, attempt_id=attempt, worker_id="w",
                               failure_reason=FailureCode.BUILD_FAILED)
    elif op in ("finish_completed", "finish_unknown"):
        outcome = Status.COMPLETED if op == "finish_completed" else Status.OUTCOME_UNKNOWN
        export.try_finish_delivery(conn, job_id=job.id, attempt_id=attempt, worker_id="w", outcome=outcome)
    elif op == "edit":
        edited = export.edit_terms(conn, tenant_id=job.tenant_id, job_id=job.id, expected_version=model.version,
                                 destination_id=job.destination_id)
        if edited.version is not None:
            model.version = edited.version
            model.queued_entries += 1
    elif op == "reconcile":
        export.reconcile(conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=attempt,
                           resolution=Status.COMPLETED if back % 2 else Status.FAILED, evidence="e",
                           reconciled_by="rita")
    elif op == "reject":
        export.reject(conn, job_id=job.id, checked_version=model.version)
    elif op == "defer":
        if export.try_defer(conn, job_id=job.id, attempt_id=attempt, worker_id="w", cause="refused",
                            delay_seconds=0) == 1:
            model.queued_entries += 1


def _check(seed, model: Model, before: Status) -> Status:
    row = seed.row(model.job)
    status = Status(row["status"])
    assert status == before or (before, status) in ALLOWED, f"{before.value} -> {status.value}"
    assert (status is Status.FAILED) == (row["failure_reason"] is not None)

    events = seed.events(model.job)
    claims = [e for e in events if e["kind"] == "Claimed"]
    assert len(claims) == len({e["attempt_id"] for e in claims}) == row["attempt_count"]
    if status is Status.QUEUED:
        assert row["attempt_id"] is None
    elif status in PROOF and row["attempt_id"] is not None:
        kinds = {e["kind"] for e in events if e["attempt_id"] == row["attempt_id"]}
        assert kinds & PROOF[status], f"{status.value} without its event: {sorted(kinds)}"

    # A stop request recorded before cutoff 2 wins: that attempt is never authorized afterwards.
    for request in seed.admin.execute(
            "SELECT found_attempt_id, recorded_at FROM cancellation_requests"
            " WHERE job_id = %s AND outcome = 'StopRequested'", (model.job.id,)).fetchall():
        assert not [e for e in events if e["kind"] == "DeliveryAuthorized"
                    and e["attempt_id"] == request["found_attempt_id"] and e["recorded_at"] > request["recorded_at"]]

    assert len(seed.outbox(model.job)) == model.queued_entries
    return status


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_any_interleaving_of_the_writers_keeps_every_transition_proved_and_every_queued_job_woken(seed, steps):
    model = Model(seed.queued())
    status = Status.QUEUED
    for op, back in steps:
        _step(seed, model, op, back)
        status = _check(seed, model, status)
