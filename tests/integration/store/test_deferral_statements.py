"""The deferral (Running -> Queued with a wake-up due later) and what it touches: its conditions, its
event and outbox row, the relay that waits for the due time, the sweeper that counts from it, a cancel
while deferred, recovery's attempt cap, and a Failed from Running that a recorded stop request beats."""

from __future__ import annotations

import uuid

import pytest
from dramatiq.brokers.stub import StubBroker

from app.config import Settings
from app.maintenance.recovery import Recovery, RecoveryConfig
from app.relay import Relay
from app.store import cancellation, export, sweeper
from app.store import metrics as store_metrics
from app.store import relay as relay_store
from app.store.database import Database
from app.store.types import CancellationOutcome, DeferResult, FailureCause, FailureCode, Role, Status, WriteResult

WORKER = "worker-test"


def _defer(seed, job, *, delay=60.0, cause="connecting: ConnectionRefusedError: refused") -> int:
    return export.try_defer(seed.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER, cause=cause,
                            delay_seconds=delay)


def _stop(seed, job):
    return cancellation.request_cancellation(seed.conn, tenant_id=job.tenant_id, job_id=job.id,
                                             request_id=uuid.uuid4(), requested_by="ops")


def test_a_deferral_returns_the_attempt_to_queued_with_its_event_and_a_wake_up_due_after_the_backoff(seed, admin):
    job = seed.running()
    before = admin.execute("SELECT clock_timestamp() AS t").fetchone()["t"]

    assert _defer(seed, job, delay=90.0) == 1

    row = seed.row(job)
    assert (row["status"], row["attempt_id"], row["claimed_by"], row["lease_expires_at"]) == (
        "Queued", None, None, None)
    assert (row["attempt_count"], row["deferrals"]) == (1, 1)
    assert row["last_deferral"] == "connecting: ConnectionRefusedError: refused"
    assert before <= row["deferred_since"] <= row["woken_at"]
    due = (row["woken_at"] - row["deferred_since"]).total_seconds()
    assert 89.0 <= due <= 91.0   # woken_at is the due time: the sweeper counts from it
    events = seed.events(job)
    assert [e["kind"] for e in events] == ["Claimed", "DeferredPartnerUnavailable"]
    assert (events[1]["attempt_id"], events[1]["worker_id"], events[1]["detail"]) == (
        job.attempt_id, WORKER, "connecting: ConnectionRefusedError: refused")
    wakeups = seed.outbox(job)
    assert len(wakeups) == 2 and wakeups[0]["due_at"] is None and wakeups[1]["due_at"] == row["woken_at"]


def test_a_second_deferral_keeps_the_first_deferrals_time_and_counts_both(seed):
    job = seed.running()
    assert _defer(seed, job, delay=0.0) == 1
    first = seed.row(job)["deferred_since"]
    again = seed.running(job)

    assert _defer(seed, again, delay=0.0, cause="circuit open") == 1

    row = seed.row(job)
    assert (row["deferrals"], row["attempt_count"], row["deferred_since"], row["last_deferral"]) == (
        2, 2, first, "circuit open")


@pytest.mark.parametrize("obstacle", ["stop request", "expired lease", "another attempt", "delivering"])
def test_a_deferral_matches_nothing_without_its_conditions_and_changes_nothing(seed, obstacle):
    job = seed.running()
    attempt = job.attempt_id
    if obstacle == "stop request":
        assert _stop(seed, job).outcome is CancellationOutcome.STOP_REQUESTED
    elif obstacle == "expired lease":
        seed.expire_lease(job)
    elif obstacle == "another attempt":
        attempt = uuid.uuid4()
    else:
        seed.delivering(job)
    before, events, outbox = seed.row(job), seed.event_kinds(job), seed.outbox(job)

    written = export.try_defer(seed.conn, job_id=job.id, attempt_id=attempt, worker_id=WORKER, cause="refused",
                               delay_seconds=1.0)

    assert written == 0
    assert (seed.row(job), seed.event_kinds(job), seed.outbox(job)) == (before, events, outbox)


@pytest.mark.parametrize(("obstacle", "answer"), [("stop request", DeferResult.STOP_RECORDED),
                                                  ("expired lease", DeferResult.LEASE_LAPSED),
                                                  ("takeover", DeferResult.NOT_OWNER)])
def test_the_deferral_wrapper_says_why_a_deferral_did_not_happen(seed, app_db, obstacle, answer):
    job = seed.running()
    if obstacle == "stop request":
        _stop(seed, job)
    elif obstacle == "expired lease":
        seed.expire_lease(job)
    else:
        seed.expire_lease(job)
        from app.store import recovery
        recovery.requeue_expired(seed.conn, [(job.id, job.attempt_id)], max_attempts=5, recovery_run_id="r")

    assert export.defer(app_db, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER, cause="refused",
                        delay_seconds=1.0) is answer


def test_a_job_canceled_while_deferred_is_canceled_while_queued_and_its_late_wake_up_finds_it_canceled(seed):
    job = seed.running()
    assert _defer(seed, job, delay=3600.0) == 1

    answer = _stop(seed, job)

    assert (answer.outcome, answer.found_status, answer.found_attempt_count) == (
        CancellationOutcome.CANCELED_WHILE_QUEUED, Status.QUEUED, 1)
    assert seed.status(job) is Status.CANCELED
    assert export.try_claim(seed.conn, job_id=job.id, checked_version=1, attempt_id=uuid.uuid4(),
                            worker_id=WORKER, lease_seconds=60) == 0


def test_the_relay_publishes_a_deferrals_wake_up_only_once_it_is_due(db_url, seed, admin):
    job = seed.running()
    assert _defer(seed, job, delay=3600.0) == 1
    broker = StubBroker()
    broker.declare_queue("exports")
    with Database(db_url, Role.DISPATCHER) as dispatcher:
        relay = Relay(Settings(database_url=db_url), dispatcher, broker)
        assert relay.run_once() == 1   # the creation's wake-up, due at once
        assert relay.run_once() == 0   # the deferral's, an hour away
        admin.execute("SET session_replication_role = replica")   # the owner moves the due time: time travel
        admin.execute("UPDATE outbox SET due_at = clock_timestamp() - interval '1 second'"
                      " WHERE job_id = %s AND due_at IS NOT NULL", (job.id,))
        admin.execute("RESET session_replication_role")
        assert relay.run_once() == 1
    assert all(row["published_at"] is not None for row in seed.outbox(job))


def test_the_sweeper_counts_a_deferred_jobs_wait_from_its_due_time(seed):
    deferred = seed.running()
    assert _defer(seed, deferred, delay=3600.0) == 1
    seed.age_wakeup(deferred, minutes=-40)   # due in 40 minutes: not lost, only waiting
    lost = seed.queued()
    seed.age_wakeup(lost, minutes=31)

    republished = sweeper.republish_due(seed.conn, sweep_after_seconds=30 * 60, batch_size=100)

    assert [r.job_id for r in republished] == [lost.id]
    assert seed.row(deferred)["sweep_count"] == 0


def test_a_worker_killed_after_many_deferrals_is_requeued_not_exhausted(seed, app_db):
    job = seed.queued()
    for _ in range(12):   # far more claims than the cap of 3, each ended by a deferral
        job = seed.running(job)
        assert _defer(seed, job, delay=0.0) == 1
    job = seed.running(job)   # the claim whose worker is killed: its lease runs out
    seed.expire_lease(job)

    counts = Recovery(app_db, RecoveryConfig(max_attempts=3)).run_once()

    assert (counts.requeued, counts.exhausted) == (1, 0)
    row = seed.row(job)
    assert (row["status"], row["attempt_count"], row["deferrals"]) == ("Queued", 13, 12)


def test_a_job_whose_worker_keeps_dying_still_ends_at_the_cap_however_often_it_was_deferred(seed, app_db):
    job = seed.queued()
    for _ in range(4):
        job = seed.running(job)
        assert _defer(seed, job, delay=0.0) == 1
    for _ in range(3):   # three claims that ended with a dead worker
        job = seed.running(job)
        seed.expire_lease(job)
        Recovery(app_db, RecoveryConfig(max_attempts=3)).run_once()

    row = seed.row(job)
    assert (row["status"], row["failure_reason"], row["attempt_count"], row["deferrals"]) == (
        "Failed", "AttemptsExhausted", 7, 4)


def test_a_stop_request_recorded_first_wins_over_a_failed_from_running(seed, app_db):
    job = seed.running()
    assert _stop(seed, job).outcome is CancellationOutcome.STOP_REQUESTED

    failed = export.finish_failed(app_db, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                  failure_reason=FailureCode.FINAL_NAME_OCCUPIED, detail="taken")
    stopped = export.finish_stopped(app_db, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                    stop_point="BeforeDelivery")

    assert (failed, stopped) == (WriteResult.NOT_MATCHED, WriteResult.WRITTEN)
    assert seed.event_kinds(job) == ["Claimed", "Stopped"]


def test_a_configuration_error_before_cutoff_2_fails_not_delivered_with_its_cause_in_the_event(seed):
    job = seed.running()

    assert export.try_finish_failed(seed.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                    failure_reason=FailureCode.NOT_DELIVERED, cause=FailureCause.CONFIGURATION,
                                    detail="AuthenticationException: Authentication failed.") == 1

    row = seed.row(job)
    assert (row["status"], row["failure_reason"]) == ("Failed", "NotDelivered")
    assert seed.events(job)[-1]["detail"] == ("NotDelivered (configuration): "
                                              "AuthenticationException: Authentication failed.")


def test_a_delivery_proven_not_written_records_its_cause_class_after_its_code(seed):
    job = seed.delivering()

    assert export.try_finish_delivery(seed.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                      outcome=Status.FAILED, failure_reason=FailureCode.NOT_DELIVERED,
                                      cause=FailureCause.TRANSIENT, detail="upload failed: EOFError") == 1

    assert seed.events(job)[-1]["detail"] == "Failed NotDelivered (transient): upload failed: EOFError"


def test_a_cause_class_outside_the_list_or_on_a_completion_matches_nothing(seed):
    job = seed.delivering()

    with pytest.raises(ValueError):
        FailureCause("flaky")
    assert export.try_finish_delivery(seed.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                      outcome=Status.COMPLETED, cause=FailureCause.TRANSIENT) == 0
    assert seed.status(job) is Status.DELIVERING


def test_a_wake_up_not_yet_due_is_scheduled_not_late_and_the_relay_knows_when_it_falls_due(seed, db_url):
    job = seed.running()
    assert _defer(seed, job, delay=120.0) == 1

    backlog = store_metrics.backlog(seed.conn)
    with Database(db_url, Role.DISPATCHER) as dispatcher, dispatcher.connection() as conn, \
            conn.transaction(force_rollback=True):
        batch = relay_store.claim_batch(conn, batch_size=200)

    # The creation's wake-up is due (and unpublished: no relay ran); the deferral's is scheduled, and
    # the batch that takes the first says when the second falls due.
    assert (backlog.unpublished, backlog.scheduled, backlog.deferred_jobs) == (1, 1, 1)
    assert [row.due_at for row in batch.rows] == [None]
    assert batch.next_due_seconds is not None and 100 < batch.next_due_seconds <= 120
    with Database(db_url, Role.DISPATCHER) as dispatcher:
        broker = StubBroker()
        broker.declare_queue("exports")
        assert Relay(Settings(database_url=db_url), dispatcher, broker).run_once() == 1
        with dispatcher.connection() as conn, conn.transaction(force_rollback=True):
            batch = relay_store.claim_batch(conn, batch_size=200)
    assert batch.rows == [] and batch.next_due_seconds is not None and 100 < batch.next_due_seconds <= 120
