"""Recovery interleavings at the statement level: the scan only nominates, and each takeover repeats
every condition it relied on, so a renewal, an authorization or an ending that commits first wins.

Concurrent interleavings hold one side in an open transaction, run the other on a thread and confirm
with pg_blocking_pids that it waits before letting the first commit.
"""

from __future__ import annotations

import uuid

import pytest

from app.store import export, recovery
from app.store.cancellation import request_cancellation
from app.store.types import (
    AuthorizationResult,
    CancellationOutcome,
    ClaimResult,
    FailureCode,
    RenewResult,
    Role,
    Status,
    WriteResult,
)
from exports_devtools.waiting import wait_until
from tests.support import wait_until_blocked

MAX_ATTEMPTS = 3
RUN = "recovery-run-1"


def requeue(conn, job, max_attempts: int = MAX_ATTEMPTS) -> bool:
    return recovery.requeue_expired(conn, [(job.id, job.attempt_id)],
                                    max_attempts=max_attempts, recovery_run_id=RUN) == [job.id]


def resolve(conn, job, resolution: Status) -> bool:
    return recovery.resolve_delivering(conn, job_id=job.id, expired_attempt_id=job.attempt_id,
                                       resolution=resolution, evidence_summary="no evidence", recovery_run_id=RUN)


def renew(conn, job) -> RenewResult:
    return export.renew_lease(conn, job_id=job.id, attempt_id=job.attempt_id, lease_seconds=60)


def authorize(app_db, seed, job) -> AuthorizationResult:
    return export.authorize_delivery(app_db, job_id=job.id, tenant_id=job.tenant_id, attempt_id=job.attempt_id,
                                   expected=seed.expected(job), replaces_job_id=None)


# --- the scan ------------------------------------------------------------------------------------


def test_the_scan_nominates_only_expired_running_and_delivering_attempts(conn, seed):
    expired_running = seed.running()
    seed.expire_lease(expired_running)
    expired_delivering = seed.delivering()
    seed.expire_lease(expired_delivering)
    current_running, current_delivering = seed.running(), seed.delivering()
    queued, completed = seed.queued(), seed.finished(Status.COMPLETED)
    controls = (current_running, current_delivering, queued, completed)
    untouched = [seed.row(j) for j in controls]

    nominated = {n.job_id: n for n in recovery.scan_expired(conn)}

    assert set(nominated) == {expired_running.id, expired_delivering.id}
    assert (nominated[expired_running.id].status, nominated[expired_running.id].attempt_id) == (
        Status.RUNNING, expired_running.attempt_id)
    assert nominated[expired_delivering.id].status is Status.DELIVERING
    assert nominated[expired_delivering.id].expected_file_name == export.final_name(expired_delivering.delivery_key)
    assert [seed.row(j) for j in controls] == untouched   # the scan writes nothing


@pytest.mark.parametrize("state", ["Running", "Delivering"])
def test_a_lease_renewed_after_the_scan_prevents_the_takeover(conn, seed, state):
    job = seed.running() if state == "Running" else seed.delivering()
    seed.expire_lease(job)
    assert [n.job_id for n in recovery.scan_expired(conn)] == [job.id]

    assert renew(conn, job) is RenewResult.RENEWED
    before, outbox_before = seed.row(job), seed.outbox(job)

    taken_over = requeue(conn, job) if state == "Running" else resolve(conn, job, Status.OUTCOME_UNKNOWN)

    assert taken_over is False
    assert seed.row(job) == before
    assert seed.outbox(job) == outbox_before
    assert "RequeuedByRecovery" not in seed.event_kinds(job) and "ResolvedByRecovery" not in seed.event_kinds(job)


# --- recovery against the original worker ---------------------------------------------------------


def test_a_late_authorization_while_a_requeue_is_uncommitted_matches_nothing(connect_as, seed):
    job = seed.running()
    seed.expire_lease(job)
    recoverer = connect_as(Role.APP, autocommit=False)
    worker = connect_as(Role.APP)
    worker.execute("SET statement_timeout = '5s'")   # fail, rather than hang, if it ever waited here
    assert requeue(recoverer, job) is True   # uncommitted

    # The lease the worker would need is already expired in the version it reads: refused without waiting.
    assert export.try_authorize_delivery(worker, job_id=job.id, tenant_id=job.tenant_id, attempt_id=job.attempt_id,
                                       expected=seed.expected(job), replaces_job_id=None) == 0
    recoverer.commit()

    row = seed.row(job)
    assert row["status"] == "Queued" and row["attempt_id"] is None and row["delivery_authorized_at"] is None
    assert seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"]


def test_a_renewal_waits_for_an_uncommitted_requeue_and_then_finds_its_attempt_gone(connect_as, admin, seed, threads):
    job = seed.running()
    seed.expire_lease(job)
    recoverer = connect_as(Role.APP, autocommit=False)
    worker = connect_as(Role.APP)
    assert requeue(recoverer, job) is True   # uncommitted

    renewal = threads.submit(renew, worker, job)
    wait_until_blocked(admin, worker.info.backend_pid, by=recoverer.info.backend_pid)
    assert not renewal.done()
    recoverer.commit()

    assert renewal.result(timeout=10) is RenewResult.LOST
    row = seed.row(job)
    assert row["status"] == "Queued" and row["attempt_id"] is None and row["lease_expires_at"] is None


def test_an_authorization_holding_the_row_makes_a_requeue_wait_and_then_match_nothing(
        connect_as, admin, seed, threads):
    job = seed.running(lease_seconds=1.5)
    worker = connect_as(Role.APP, autocommit=False)
    # The authorization needs a current lease; recovery needs an expired one. Both hold only if the lease
    # runs out while the authorization's transaction is still open.
    assert export.try_authorize_delivery(worker, job_id=job.id, tenant_id=job.tenant_id, attempt_id=job.attempt_id,
                                       expected=seed.expected(job), replaces_job_id=None) == 1
    wait_until(lambda: admin.execute("SELECT lease_expires_at < clock_timestamp() AS expired FROM export_jobs"
                                     " WHERE id = %s", (job.id,)).fetchone()["expired"], "the lease to run out")
    recoverer = connect_as(Role.APP)
    outbox_before = seed.outbox(job)

    takeover = threads.submit(requeue, recoverer, job)
    wait_until_blocked(admin, recoverer.info.backend_pid, by=worker.info.backend_pid)
    worker.commit()

    assert takeover.result(timeout=10) is False
    row = seed.row(job)
    assert row["status"] == "Delivering" and row["attempt_id"] == job.attempt_id
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized"]
    assert seed.outbox(job) == outbox_before


def test_an_expired_worker_is_refused_at_cutoff_2_until_it_renews_and_then_is_authorized(app_db, conn, seed):
    job = seed.running()
    seed.expire_lease(job)
    before = seed.row(job)

    assert authorize(app_db, seed, job) is AuthorizationResult.LEASE_LAPSED
    assert seed.row(job) == before

    assert renew(conn, job) is RenewResult.RENEWED
    assert authorize(app_db, seed, job) is AuthorizationResult.AUTHORIZED
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized"]


@pytest.mark.parametrize("state", ["Running", "Delivering"])
def test_an_expired_lease_can_be_renewed_while_no_takeover_has_committed(conn, seed, state):
    job = seed.running() if state == "Running" else seed.delivering()
    seed.expire_lease(job)

    assert renew(conn, job) is RenewResult.RENEWED

    row = seed.row(job)
    assert row["status"] == state and row["lease_expires_at"] > conn.execute("SELECT now() AS t").fetchone()["t"]


@pytest.mark.parametrize("state", ["Running", "Delivering"])
def test_a_renewal_after_a_takeover_changes_nothing(conn, seed, state):
    job = seed.running() if state == "Running" else seed.delivering()
    seed.expire_lease(job)
    assert requeue(conn, job) if state == "Running" else resolve(conn, job, Status.OUTCOME_UNKNOWN)
    before = seed.row(job)

    assert renew(conn, job) is RenewResult.LOST

    assert seed.row(job) == before


# --- how recovery ends an expired Running attempt -------------------------------------------------


def test_an_expired_attempt_with_a_stop_request_ends_stopped_by_recovery(conn, seed):
    job = seed.running()
    request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(), requested_by="op")
    seed.expire_lease(job)
    outbox_before = seed.outbox(job)

    assert requeue(conn, job) is False   # a stop request is never turned into another attempt
    assert recovery.exhaust_expired(conn, [(job.id, job.attempt_id)],
                                    max_attempts=1, recovery_run_id=RUN) == []
    assert recovery.stop_expired(conn, [(job.id, job.attempt_id)], recovery_run_id=RUN)

    row = seed.row(job)
    assert row["status"] == "Stopped" and row["attempt_id"] == job.attempt_id and row["lease_expires_at"] is None
    [*_, event] = seed.events(job)
    assert (event["kind"], event["attempt_id"], event["observed_by"]) == ("StoppedByRecovery", job.attempt_id, RUN)
    assert seed.outbox(job) == outbox_before


def test_an_expired_attempt_at_the_attempt_cap_ends_failed_attempts_exhausted(conn, seed):
    job = seed.running()
    seed.expire_lease(job)

    assert requeue(conn, job, max_attempts=1) is False
    assert recovery.stop_expired(conn, [(job.id, job.attempt_id)], recovery_run_id=RUN) == []
    assert recovery.exhaust_expired(conn, [(job.id, job.attempt_id)], max_attempts=1,
                                    recovery_run_id=RUN)

    row = seed.row(job)
    assert (row["status"], row["failure_reason"], row["attempt_id"]) == ("Failed", "AttemptsExhausted", job.attempt_id)
    [*_, event] = seed.events(job)
    assert (event["kind"], event["attempt_id"], event["observed_by"]) == ("AttemptsExhausted", job.attempt_id, RUN)


def test_a_requeue_records_its_event_writes_a_new_wakeup_and_clears_the_attempt(conn, seed):
    job = seed.running()
    seed.expire_lease(job)
    [created] = seed.outbox(job)

    assert requeue(conn, job) is True

    row = seed.row(job)
    assert row["status"] == "Queued" and row["attempt_id"] is None and row["claimed_by"] is None
    assert row["lease_expires_at"] is None and row["attempt_count"] == 1
    [*_, event] = seed.events(job)
    assert (event["kind"], event["attempt_id"], event["observed_by"]) == ("RequeuedByRecovery", job.attempt_id, RUN)
    outbox = seed.outbox(job)
    assert len(outbox) == 2 and outbox[1]["message_id"] != created["message_id"]


def test_a_cancellation_after_a_requeue_records_canceled_while_queued_with_the_attempts_made(conn, seed):
    job = seed.running()
    seed.expire_lease(job)
    assert requeue(conn, job)

    result = request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(),
                                  requested_by="op")

    assert result.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED
    assert (result.found_status, result.found_attempt_id, result.found_attempt_count) == (Status.QUEUED, None, 1)
    assert seed.status(job) is Status.CANCELED


# --- how recovery ends an expired Delivering attempt ----------------------------------------------


def test_a_batch_of_requeues_takes_over_each_expired_attempt_with_its_own_event_and_skips_a_renewed_one(conn, seed):
    jobs = [seed.running() for _ in range(3)]
    for job in jobs:
        seed.expire_lease(job)
    renewed = jobs[1]
    assert renew(conn, renewed) is RenewResult.RENEWED   # after the scan would have nominated it

    requeued = recovery.requeue_expired(conn, [(j.id, j.attempt_id) for j in jobs], max_attempts=MAX_ATTEMPTS,
                                        recovery_run_id=RUN)

    assert sorted(requeued) == sorted([jobs[0].id, jobs[2].id])
    for job in (jobs[0], jobs[2]):
        assert seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"] and len(seed.outbox(job)) == 2
    assert seed.status(renewed) is Status.RUNNING and seed.event_kinds(renewed) == ["Claimed"]


def test_a_second_recovery_of_the_same_batch_waits_for_the_first_and_then_requeues_nothing(
        connect_as, admin, seed, threads):
    jobs = sorted((seed.running() for _ in range(4)), key=lambda j: j.id)
    for job in jobs:
        seed.expire_lease(job)
    first, second = connect_as(Role.APP, autocommit=False), connect_as(Role.APP, autocommit=False)
    pairs = [(j.id, j.attempt_id) for j in jobs]
    # The first locks and requeues the whole batch and holds it; the second, given the nominations in
    # the opposite order, waits for it rather than locking half the batch and deadlocking.
    assert len(recovery.requeue_expired(first, pairs, max_attempts=MAX_ATTEMPTS, recovery_run_id="one")) == 4
    later = threads.submit(recovery.requeue_expired, second, list(reversed(pairs)), max_attempts=MAX_ATTEMPTS,
                           recovery_run_id="two")
    wait_until_blocked(admin, second.info.backend_pid, by=first.info.backend_pid)
    first.commit()

    assert later.result(timeout=10) == []
    second.commit()
    for job in jobs:
        assert seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"]



@pytest.mark.parametrize("resolution", [Status.COMPLETED, Status.OUTCOME_UNKNOWN])
def test_an_expired_delivering_attempt_is_resolved_completed_or_outcome_unknown_with_its_event(conn, seed, resolution):
    job = seed.delivering()
    seed.expire_lease(job)

    assert resolve(conn, job, resolution) is True

    assert seed.status(job) is resolution
    [*_, event] = seed.events(job)
    assert (event["kind"], event["attempt_id"]) == ("ResolvedByRecovery", job.attempt_id)
    assert event["detail"].startswith(resolution.value)


@pytest.mark.parametrize("resolution", [Status.FAILED, Status.QUEUED])
def test_an_expired_delivering_attempt_is_never_resolved_failed_or_queued(conn, seed, resolution):
    job = seed.delivering()
    seed.expire_lease(job)
    before, outbox_before = seed.row(job), seed.outbox(job)

    assert resolve(conn, job, resolution) is False
    # Nor do the Running takeovers reach it: a delivering attempt is never retried.
    assert requeue(conn, job) is False
    assert recovery.exhaust_expired(conn, [(job.id, job.attempt_id)], max_attempts=1,
                                    recovery_run_id=RUN) == []

    assert seed.row(job) == before
    assert seed.outbox(job) == outbox_before
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized"]


def test_a_late_receipt_from_a_superseded_attempt_is_kept_as_evidence_and_changes_no_state(conn, seed):
    job = seed.delivering()
    seed.expire_lease(job)
    assert resolve(conn, job, Status.OUTCOME_UNKNOWN)
    before = seed.row(job)

    assert export.append_evidence(conn, job_id=job.id, attempt_id=job.attempt_id,
                                  observed_by=f"attempt:{job.attempt_id}", detail="rename confirmed: size 123")

    assert seed.row(job) == before
    [*_, event] = seed.events(job)
    assert (event["kind"], event["attempt_id"], event["detail"]) == (
        "DeliveryEvidence", job.attempt_id, "rename confirmed: size 123")


# --- the original worker after a takeover ---------------------------------------------------------


def _taken_over_while_running(seed, conn):
    """The original attempt was requeued and a new attempt now runs the job, with a stop request."""
    job = seed.running()
    seed.expire_lease(job)
    assert requeue(conn, job)
    successor = seed.running(job)
    request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(), requested_by="op")
    return job, successor


@pytest.mark.parametrize("write", [
    lambda db, job: export.finish_stopped(db, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                          stop_point="build"),
    lambda db, job: export.finish_failed(db, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                       failure_reason=FailureCode.BUILD_FAILED),
], ids=["finish_stopped", "finish_failed"])
def test_after_a_takeover_the_original_attempts_terminal_write_matches_nothing(app_db, conn, seed, write):
    job, successor = _taken_over_while_running(seed, conn)
    before, events_before = seed.row(job), seed.events(job)

    assert write(app_db, job) is WriteResult.NOT_MATCHED

    assert seed.row(job) == before and before["attempt_id"] == successor.attempt_id
    assert seed.events(job) == events_before


def test_after_a_takeover_the_original_attempts_delivery_outcome_matches_nothing(app_db, conn, seed):
    job = seed.delivering()
    seed.expire_lease(job)
    assert resolve(conn, job, Status.OUTCOME_UNKNOWN)
    before, events_before = seed.row(job), seed.events(job)

    for outcome in (Status.COMPLETED, Status.OUTCOME_UNKNOWN):
        assert export.finish_delivery(app_db, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                    outcome=outcome) is WriteResult.NOT_MATCHED
    assert export.finish_delivery(app_db, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                  outcome=Status.FAILED,
                                  failure_reason=FailureCode.NOT_DELIVERED) is WriteResult.NOT_MATCHED

    assert seed.row(job) == before
    assert seed.events(job) == events_before


def test_after_a_takeover_the_original_attempts_authorization_is_refused(app_db, conn, seed):
    job, successor = _taken_over_while_running(seed, conn)
    before = seed.row(job)

    assert authorize(app_db, seed, job) is AuthorizationResult.NOT_OWNER

    assert seed.row(job) == before


# --- a job that crashes its worker every time -----------------------------------------------------


def test_a_job_that_crashes_on_every_attempt_ends_failed_attempts_exhausted_at_the_cap(app_db, conn, seed):
    job = seed.queued()
    for _ in range(MAX_ATTEMPTS):
        attempt_id = uuid.uuid4()
        assert export.claim(app_db, job_id=job.id, checked_version=1, attempt_id=attempt_id, worker_id="w",
                          lease_seconds=60) is ClaimResult.CLAIMED
        seed.expire_lease(job)   # the worker died: nothing renews its lease
        # One recovery pass, as the scheduler runs it: requeue, or exhaust at the cap.
        [nominee] = recovery.scan_expired(conn)
        assert nominee.attempt_id == attempt_id
        kw = dict(max_attempts=MAX_ATTEMPTS, recovery_run_id=RUN)
        nominated = [(job.id, attempt_id)]
        assert recovery.requeue_expired(conn, nominated, **kw) or recovery.exhaust_expired(conn, nominated, **kw)

    row = seed.row(job)
    assert (row["status"], row["failure_reason"], row["attempt_count"]) == ("Failed", "AttemptsExhausted", MAX_ATTEMPTS)
    assert seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"] * (MAX_ATTEMPTS - 1) + [
        "Claimed", "AttemptsExhausted"]
    assert len(seed.outbox(job)) == MAX_ATTEMPTS   # the creation's wake-up and one per requeue
