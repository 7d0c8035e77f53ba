"""The runner end to end with the real store and a real SFTP peer: the happy path, policy, a changed
request, and stop requests on each side of cutoff 2."""

from __future__ import annotations

import csv
import hashlib
import io
import json

import pytest

from app.actors.policy import ExportPolicy
from app.actors.runner import RunOutcome
from app.store import export
from app.store.types import CancellationOutcome, EditResult, Status, WriteResult
from exports_devtools.waiting import wait_until
from tests.fixtures.worker import Gate, after_cutoff_2, insert_destination
from tests.support import Background


def _evidence(seed, job) -> list[dict]:
    return [e for e in seed.events(job) if e["kind"] == "DeliveryEvidence"]


@pytest.mark.parametrize("harness", ["worker", pytest.param("openssh_worker", marks=pytest.mark.openssh)])
def test_a_queued_job_is_delivered_exactly_once_with_its_events_and_evidence(request, harness):
    worker = request.getfixturevalue(harness)
    job = worker.queued()
    untouched = worker.queued()

    result = worker.runner().run(job.id)

    assert (result.outcome, result.write, result.delivery) == (RunOutcome.DELIVERED, WriteResult.WRITTEN,
                                                               Status.COMPLETED)
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_id"], row["attempt_count"]) == ("Completed", result.attempt_id, 1)
    final = export.final_name(job.delivery_key)
    files = worker.peer.files()
    assert list(files) == [final]   # no temporary file left behind, nothing else written
    assert hashlib.sha256(files[final]).digest() == bytes(row["expected_file_sha256"])
    assert len(files[final]) == row["expected_file_bytes"]
    rows = list(csv.DictReader(io.StringIO(files[final].decode())))
    assert len(rows) == 25 and not any(r["email"].startswith("no-consent-") for r in rows)
    kinds = worker.seed.event_kinds(job)
    # The baseline is recorded while the job is Running, before cutoff 2; the receipt and the outcome after.
    assert kinds[:3] == ["Claimed", "DeliveryEvidence", "DeliveryAuthorized"] and kinds[-1] == "Finished"
    assert set(kinds[3:-1]) == {"DeliveryEvidence"} and len(kinds[3:-1]) >= 2
    evidence = _evidence(worker.seed, job)
    assert {e["observed_by"] for e in evidence} == {f"worker-under-test/{result.attempt_id}"}
    assert {e["attempt_id"] for e in evidence} == {result.attempt_id}
    stages = [json.loads(e["detail"])["stage"] for e in evidence]
    assert stages[0] == "baseline" and stages[-1] == "outcome"
    assert worker.local_files() == []
    assert worker.seed.status(untouched) is Status.QUEUED

    # The same wake-up delivered again finds the row no longer Queued and does nothing.
    again = worker.runner().run(job.id)
    assert again.outcome is RunOutcome.NOT_QUEUED
    assert worker.seed.event_kinds(job) == kinds and list(worker.peer.files()) == [final]


def test_a_job_whose_destination_is_inactive_is_rejected_for_the_version_evaluated(worker):
    inactive = insert_destination(worker.conn, worker.tenant_id, worker.peer.config, active=False)
    job = worker.queued(inactive)
    untouched = worker.queued()

    result = worker.runner().run(job.id)

    assert result.outcome is RunOutcome.REJECTED
    row = worker.seed.row(job)
    assert (row["status"], row["version"], row["attempt_count"]) == ("Rejected", 1, 0)
    assert worker.seed.event_kinds(job) == []
    assert worker.seed.status(untouched) is Status.QUEUED
    assert worker.peer.files() == {} and worker.local_files() == []


class _EditAfterEvaluating(ExportPolicy):
    """Evaluates, then lets a terms edit commit before the runner acts on the decision."""

    def __init__(self, worker, job, new_destination):
        self.worker, self.job, self.new_destination = worker, job, new_destination
        self.decisions = []

    def evaluate(self, job):
        decision = super().evaluate(job)
        self.decisions.append(decision)
        edit = export.edit_terms(self.worker.conn, tenant_id=self.job.tenant_id, job_id=self.job.id,
                               expected_version=job.version, destination_id=self.new_destination)
        assert edit.result is EditResult.CHANGED
        return decision


def test_a_worker_that_evaluated_the_old_terms_fails_its_claim_and_builds_nothing(worker):
    other = insert_destination(worker.conn, worker.tenant_id, worker.peer.config)
    job = worker.queued()
    runner = worker.runner()
    runner.policy = policy = _EditAfterEvaluating(worker, job, other)

    result = runner.run(job.id)

    assert result.outcome is RunOutcome.NOT_CLAIMED and policy.decisions[0].allowed
    row = worker.seed.row(job)
    assert (row["status"], row["version"], row["destination_id"], row["attempt_count"]) == ("Queued", 2, other, 0)
    assert worker.seed.event_kinds(job) == []
    assert worker.local_files() == [] and worker.peer.files() == {}
    assert len(worker.seed.outbox(job)) == 2   # the edit's own wake-up brings it back to a worker


def test_a_rejection_of_terms_edited_meanwhile_matches_nothing_and_the_job_stays_queued(worker):
    inactive = insert_destination(worker.conn, worker.tenant_id, worker.peer.config, active=False)
    job = worker.queued(inactive)
    runner = worker.runner()
    runner.policy = _EditAfterEvaluating(worker, job, worker.destination_id)

    result = runner.run(job.id)

    assert result.outcome is RunOutcome.REJECTED
    row = worker.seed.row(job)
    assert (row["status"], row["version"], row["destination_id"]) == ("Queued", 2, worker.destination_id)


def test_a_stop_request_while_building_ends_stopped_through_the_notification_and_removes_the_partial_file(worker):
    job = worker.queued()
    gate = Gate()
    runner = worker.runner(checkpoint=gate, stop_poll_seconds=60)   # only the notification can be fast
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    assert [name.endswith(".csv.part") for name in worker.local_files()] == [True]
    # The watcher has listened and checked the new attempt once, so only the notification is left.
    wait_until(lambda: runner.watcher.polls >= 1, "the watcher's first check")

    stop = worker.request_stop(job)
    result = run.result()

    assert stop.outcome is CancellationOutcome.STOP_REQUESTED
    assert (result.outcome, result.write) == (RunOutcome.STOPPED, WriteResult.WRITTEN)
    assert (runner.watcher.confirmed_by_notify, runner.watcher.confirmed_by_poll) == (1, 0)
    assert worker.seed.status(job) is Status.STOPPED
    events = worker.seed.events(job)
    assert [e["kind"] for e in events] == ["Claimed", "Stopped"] and events[1]["detail"] == "WhileBuilding"
    assert worker.local_files() == [] and worker.peer.files() == {}


def test_a_stop_request_committed_before_cutoff_2_is_never_followed_by_an_upload(worker):
    job = worker.queued()
    gate = Gate()
    # The watcher neither listens nor polls in time: cutoff 2 alone must refuse.
    runner = worker.runner(checkpoint=gate, stop_poll_seconds=60, listen=False)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    assert worker.request_stop(job).outcome is CancellationOutcome.STOP_REQUESTED
    gate.open()
    result = run.result()

    assert (result.outcome, result.write) == (RunOutcome.STOPPED, WriteResult.WRITTEN)
    events = worker.seed.events(job)
    # The partner was only looked at (the baseline, recorded while Running); cutoff 2 refused the rest.
    assert [e["kind"] for e in events] == ["Claimed", "DeliveryEvidence", "Stopped"]
    assert json.loads(events[1]["detail"])["stage"] == "baseline" and events[2]["detail"] == "BeforeDelivery"
    assert worker.peer.files() == {} and worker.local_files() == []
    assert worker.seed.row(job)["delivery_authorized_at"] is None


@pytest.mark.parametrize("harness", ["worker", pytest.param("openssh_worker", marks=pytest.mark.openssh)])
def test_a_stop_request_after_cutoff_2_is_recorded_as_too_late_and_the_file_is_delivered(request, harness):
    worker = request.getfixturevalue(harness)
    job = worker.queued()
    answers = []

    def stop_after_cutoff_2():
        answers.append(worker.request_stop(job))

    result = worker.runner(destination_for=after_cutoff_2(worker.peer.environ, stop_after_cutoff_2),
                           stop_poll_seconds=0.05).run(job.id)

    assert answers[0].outcome is CancellationOutcome.TOO_LATE
    assert (result.outcome, result.write, result.delivery) == (RunOutcome.DELIVERED, WriteResult.WRITTEN,
                                                               Status.COMPLETED)
    assert worker.seed.status(job) is Status.COMPLETED
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]
    assert worker.seed.row(job)["stop_request_id"] is None   # recorded as a request, not as a stop


def test_a_job_whose_destination_cannot_be_configured_is_rejected_rather_than_retried(worker):
    unusable = insert_destination(worker.conn, worker.tenant_id, worker.peer.config)
    # The owner writes what no operator script would accept: a pinned key for another host.
    worker.admin.execute("UPDATE destinations SET host = '203.0.113.9' WHERE id = %s", (unusable,))
    job = worker.queued(unusable)

    result = worker.runner().run(job.id)

    assert result.outcome is RunOutcome.REJECTED
    assert worker.seed.status(job) is Status.REJECTED and worker.seed.event_kinds(job) == []
