"""Leases from the runner's side: a long build keeps its lease, a paused worker renews only while no
takeover has committed, and an attempt that was taken over writes nothing to the row."""

from __future__ import annotations

import json

from app.actors.runner import RunOutcome
from app.actors.stop import StopReason
from app.store import export, recovery
from app.store.types import RenewResult, Status, WriteResult
from exports_devtools.waiting import wait_until
from tests.fixtures.worker import Gate, after_cutoff_2
from tests.support import Background

RUN = "recovery-test"


def _attempt(worker, job):
    return worker.seed.row(job)["attempt_id"]


def _requeue(worker, job):
    """Recovery's takeover of an expired Running attempt, committed."""
    attempt_id = _attempt(worker, job)
    with worker.seed.lease_expired(job):
        assert recovery.requeue_expired(worker.seed.conn, [(job.id, attempt_id)], max_attempts=5,
                                        recovery_run_id=RUN)


#: A lease the test outlasts on purpose: long enough that a renewal due every half second still lands
#: in time on a loaded machine, whose threads can wait seconds for a core (1.5 s was lost under load).
OUTLASTED_LEASE = 6.0


def test_a_build_that_outlasts_the_initial_lease_keeps_renewing_and_delivers_exactly_once(worker):
    job = worker.queued()
    gate = Gate()
    runner = worker.runner(checkpoint=gate, lease_seconds=OUTLASTED_LEASE, renew_seconds=0.5)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    initial = worker.seed.row(job)["lease_expires_at"]

    keeper = runner.leases.keeper
    wait_until(lambda: keeper.renewals >= 2, "two renewals")
    # Past the lease the claim gave it, the attempt still holds a current one: recovery finds nothing.
    wait_until(lambda: worker.admin.execute("SELECT clock_timestamp() > %s AS past", (initial,)).fetchone()["past"],
               "the initial lease to run out", timeout=OUTLASTED_LEASE + 10)
    assert worker.seed.row(job)["lease_expires_at"] > initial
    assert job.id not in [a.job_id for a in recovery.scan_expired(worker.conn)]
    gate.open()
    result = run.result()

    assert (result.outcome, result.write, result.delivery) == (RunOutcome.DELIVERED, WriteResult.WRITTEN,
                                                               Status.COMPLETED)
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_count"]) == ("Completed", 1)
    assert worker.seed.event_kinds(job).count("Claimed") == 1
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]
    assert not keeper.lost and keeper.failures == 0


def test_an_upload_that_outlasts_the_initial_lease_keeps_it_renewed_and_completes_without_a_takeover(worker):
    job = worker.queued()
    faults = worker.peer.server.faults
    faults.hold_on = frozenset({"write"})   # the partner takes the first write and sits on it
    runner = worker.runner(lease_seconds=OUTLASTED_LEASE, renew_seconds=0.5)
    run = Background(lambda: runner.run(job.id))
    assert faults.held.wait(60)
    assert worker.seed.status(job) is Status.DELIVERING
    lease_at_upload = worker.seed.row(job)["lease_expires_at"]

    keeper = runner.leases.keeper
    renewed = keeper.renewals
    wait_until(lambda: worker.admin.execute("SELECT clock_timestamp() > %s AS past",
                                            (lease_at_upload,)).fetchone()["past"],
               "the lease held when the upload began to run out", timeout=OUTLASTED_LEASE + 10)
    wait_until(lambda: keeper.renewals > renewed, "a renewal during the upload")
    assert worker.seed.row(job)["lease_expires_at"] > lease_at_upload
    assert job.id not in [a.job_id for a in recovery.scan_expired(worker.conn)]
    faults.resume.set()
    result = run.result()

    assert (result.outcome, result.write, result.delivery) == (RunOutcome.DELIVERED, WriteResult.WRITTEN,
                                                               Status.COMPLETED)
    kinds = worker.seed.event_kinds(job)
    assert "ResolvedByRecovery" not in kinds and kinds.count("Finished") == 1
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]
    assert not keeper.lost and keeper.failures == 0


def test_a_worker_paused_past_its_lease_is_refused_at_cutoff_2_renews_and_then_delivers(worker):
    job = worker.queued()
    gate = Gate(on_reach=lambda: worker.seed.expire_lease(job))   # no scheduled renewal comes in time
    runner = worker.runner(checkpoint=gate, lease_seconds=30, renew_seconds=60)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    gate.open()
    result = run.result()

    assert (result.outcome, result.write, result.delivery) == (RunOutcome.DELIVERED, WriteResult.WRITTEN,
                                                               Status.COMPLETED)
    history = runner.leases.keeper.history
    assert [(r.kind, r.result) for r in history] == [("on-demand", RenewResult.RENEWED)]
    authorized_at = worker.seed.row(job)["delivery_authorized_at"]
    assert authorized_at is not None
    transitions = [k for k in worker.seed.event_kinds(job) if k != "DeliveryEvidence"]
    assert transitions[:2] == ["Claimed", "DeliveryAuthorized"]
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]


def test_a_paused_worker_whose_attempt_was_taken_over_finds_its_renewal_changes_nothing_and_stops(worker):
    job = worker.queued()
    gate = Gate(on_reach=lambda: _requeue(worker, job))
    runner = worker.runner(checkpoint=gate, lease_seconds=30, renew_seconds=0.2)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    keeper = runner.leases.keeper
    # The gate stays shut: only the lost lease can end this build.
    result = run.result()

    assert result.outcome is RunOutcome.GAVE_UP and result.write is None
    assert keeper.lost and keeper.history[-1].result is RenewResult.LOST
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_id"], row["lease_expires_at"]) == ("Queued", None, None)
    assert worker.seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"]
    assert len(worker.seed.outbox(job)) == 2
    assert worker.local_files() == [] and worker.peer.files() == {}


def test_a_paused_attempt_taken_over_before_cutoff_2_is_refused_there_and_the_next_attempt_delivers(worker):
    job = worker.queued()
    gate = Gate(on_reach=lambda: _requeue(worker, job))
    runner = worker.runner(checkpoint=gate, lease_seconds=30, renew_seconds=60)   # no renewal reports the loss
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    gate.open()
    result = run.result()

    assert result.outcome is RunOutcome.GAVE_UP and result.write is None
    # The superseded attempt looked at the partner (its baseline is kept as evidence) and changed nothing.
    assert worker.seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery", "DeliveryEvidence"]
    assert worker.seed.row(job)["delivery_authorized_at"] is None
    assert worker.local_files() == [] and worker.peer.files() == {}

    # Recovery's wake-up brings the job to a worker that delivers it, once.
    again = worker.runner().run(job.id)
    assert again.delivery is Status.COMPLETED
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_count"], row["attempt_id"]) == ("Completed", 2, again.attempt_id)
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]


def test_a_paused_attempt_whose_build_then_fails_records_nothing_after_a_takeover(worker, caplog):
    job = worker.queued()

    def taken_over_then_broken(stop):
        _requeue(worker, job)
        raise RuntimeError("disk full")

    result = worker.runner(checkpoint=taken_over_then_broken, renew_seconds=60).run(job.id)

    assert result.outcome is RunOutcome.FAILED and result.write is WriteResult.NOT_MATCHED
    # The log says the terminal write matched nothing, rather than that the export failed.
    events = [r.getMessage() for r in caplog.records if r.name.startswith("app.actors.")]
    assert "runner.terminal_write_not_matched" in events
    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"], row["attempt_id"]) == ("Queued", None, None)
    assert worker.seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"]
    assert worker.local_files() == []


def test_a_build_that_fails_on_its_own_ends_failed_with_build_failed(worker):
    job = worker.queued()

    def broken(stop):
        raise RuntimeError("disk full")

    result = worker.runner(checkpoint=broken).run(job.id)

    assert (result.outcome, result.write) == (RunOutcome.FAILED, WriteResult.WRITTEN)
    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"]) == ("Failed", "BuildFailed")
    events = worker.seed.events(job)
    assert [e["kind"] for e in events] == ["Claimed", "Failed"] and "disk full" in events[1]["detail"]
    assert worker.local_files() == [] and worker.peer.files() == {}


def test_an_upload_taken_over_by_recovery_still_finishes_keeps_its_evidence_and_its_terminal_write_matches_nothing(
        worker):
    job = worker.queued()
    runners = []

    def taken_over():
        attempt_id = _attempt(worker, job)
        with worker.seed.lease_expired(job):
            assert recovery.resolve_delivering(worker.seed.conn, job_id=job.id, expired_attempt_id=attempt_id,
                                               resolution=Status.OUTCOME_UNKNOWN,
                                               evidence_summary="no receipt yet", recovery_run_id=RUN)
        # The keeper reports the loss before the upload starts: a lost lease never stops an upload.
        keeper = runners[0].leases.keeper
        wait_until(lambda: keeper.lost, "the keeper to report the lost lease")
        assert keeper.history[-1].result is RenewResult.LOST

    runners.append(worker.runner(destination_for=after_cutoff_2(worker.peer.environ, taken_over), renew_seconds=0.2))
    result = runners[0].run(job.id)

    assert (result.outcome, result.delivery, result.write) == (RunOutcome.DELIVERED, Status.COMPLETED,
                                                               WriteResult.NOT_MATCHED)
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_id"]) == ("OutcomeUnknown", result.attempt_id)
    kinds = [k for k in worker.seed.event_kinds(job) if k != "DeliveryEvidence"]
    assert kinds[:3] == ["Claimed", "DeliveryAuthorized", "ResolvedByRecovery"] and "Finished" not in kinds
    outcome = [json.loads(e["detail"]) for e in worker.seed.events(job) if e["kind"] == "DeliveryEvidence"][-1]
    assert (outcome["stage"], outcome["outcome"]) == ("outcome", "Completed")
    assert runners[0].leases.keeper.lost and runners[0].leases.keeper._stop.reason is StopReason.LEASE_LOST


def test_a_worker_shutting_down_mid_build_stops_it_writes_nothing_and_leaves_the_job_running_for_recovery(worker):
    job = worker.queued()
    gate = Gate()
    runner = worker.runner(checkpoint=gate, renew_seconds=0.2)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)

    assert runner.shutdown() == 1
    result = run.result()

    assert result.outcome is RunOutcome.GAVE_UP and result.write is None
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_id"]) == ("Running", result.attempt_id)
    assert worker.seed.event_kinds(job) == ["Claimed"]
    assert worker.local_files() == [] and worker.peer.files() == {}
    keeper = runner.leases.keeper
    count = len(keeper.history)
    assert keeper._finished.is_set() and not keeper.lost   # no renewal keeps the abandoned lease alive
    wait_until(lambda: runner.leases.leases.scheduler.get_jobs() == [], "the renewal schedule to be gone")
    assert len(keeper.history) == count


def test_a_worker_shutting_down_during_an_upload_lets_the_upload_finish(worker):
    job = worker.queued()
    runners = []

    def shutdown():
        assert runners[0].shutdown() == 1

    runners.append(worker.runner(destination_for=after_cutoff_2(worker.peer.environ, shutdown)))
    result = runners[0].run(job.id)

    assert (result.outcome, result.delivery, result.write) == (RunOutcome.DELIVERED, Status.COMPLETED,
                                                               WriteResult.WRITTEN)
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]
