"""Lost responses from the runner's side: the worker's pool reaches the database through a proxy that
loses the reply to one boundary write. The runner settles each case from the row, never from the
exception, and never repeats an external effect because a database write was uncertain."""

from __future__ import annotations

import pytest

from app.actors.runner import RunOutcome
from app.store import export, recovery
from app.store.database import Database
from app.store.types import Role, Status, WriteResult

CLAIM = "export_claim"
AUTHORIZE = "export_authorize_delivery"


@pytest.fixture(autouse=True)
def fast_reread(monkeypatch) -> None:
    monkeypatch.setattr(export, "REREAD_TIMEOUT_SECONDS", 1)


@pytest.fixture
def proxied(worker, pg_proxy):
    """A runner whose every protocol write and re-read goes through the proxy."""
    db = Database(pg_proxy.url, Role.APP, max_size=2, name="worker")

    def make(**kwargs):
        runner = worker.runner(**kwargs)
        runner.db = db
        return runner

    yield make
    db.close()


def test_a_claim_whose_reply_was_lost_after_it_committed_is_confirmed_and_the_job_is_delivered_once(
        worker, proxied, pg_proxy):
    job = worker.queued()
    cut = pg_proxy.cut_after_reply(CLAIM)

    result = proxied().run(job.id)

    cut.wait()
    assert (result.outcome, result.delivery, result.write) == (RunOutcome.DELIVERED, Status.COMPLETED,
                                                               WriteResult.WRITTEN)
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_count"]) == ("Completed", 1)
    assert worker.seed.event_kinds(job).count("Claimed") == 1
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]


def test_a_cutoff_2_whose_reply_was_lost_after_it_committed_is_confirmed_and_delivers_once(
        worker, proxied, pg_proxy):
    job = worker.queued()
    cut = pg_proxy.cut_after_reply(AUTHORIZE)

    result = proxied().run(job.id)

    cut.wait()
    assert (result.outcome, result.delivery) == (RunOutcome.DELIVERED, Status.COMPLETED)
    assert worker.seed.event_kinds(job).count("DeliveryAuthorized") == 1
    assert list(worker.peer.files()) == [export.final_name(job.delivery_key)]


def test_a_claim_lost_before_the_database_saw_it_with_a_failed_reread_stays_unsettled_and_runs_once_later(
        worker, proxied, pg_proxy):
    job = worker.queued()
    cut = pg_proxy.cut_before(CLAIM, then_refuse=True)

    first = proxied().run(job.id)

    cut.wait()
    assert first.outcome is RunOutcome.CLAIM_UNKNOWN   # the actor raises ClaimUnknown: redelivered later
    assert worker.seed.row(job)["status"] == "Queued" and worker.seed.events(job) == []
    assert worker.local_files() == [] and worker.peer.files() == {}

    pg_proxy.accept_connections()
    again = proxied().run(job.id)
    assert again.delivery is Status.COMPLETED
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_count"], row["attempt_id"]) == ("Completed", 1, again.attempt_id)


def test_a_claim_that_committed_with_a_failed_reread_builds_nothing_and_the_redelivery_does_nothing(
        worker, proxied, pg_proxy):
    job = worker.queued()
    cut = pg_proxy.cut_after_reply(CLAIM, then_refuse=True)

    first = proxied().run(job.id)

    cut.wait()
    assert first.outcome is RunOutcome.CLAIM_UNKNOWN
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_id"]) == ("Running", first.attempt_id)
    assert worker.local_files() == []

    again = worker.runner().run(job.id)   # the redelivered message
    assert again.outcome is RunOutcome.NOT_QUEUED
    assert worker.seed.row(job)["attempt_id"] == first.attempt_id   # recovery takes it when the lease expires
    assert worker.seed.event_kinds(job) == ["Claimed"] and worker.peer.files() == {}


def test_a_worker_whose_attempt_recovery_resolved_before_its_reread_does_nothing_further(
        worker, proxied, pg_proxy):
    job = worker.queued()

    def recovery_resolves_first():
        attempt_id = worker.seed.row(job)["attempt_id"]
        worker.seed.expire_lease(job)
        assert recovery.resolve_delivering(worker.conn, job_id=job.id, expired_attempt_id=attempt_id,
                                           resolution=Status.OUTCOME_UNKNOWN, evidence_summary="no evidence",
                                           recovery_run_id="recovery-1")

    cut = pg_proxy.cut_after_reply(AUTHORIZE, on_cut=recovery_resolves_first)

    result = proxied(renew_seconds=60).run(job.id)

    cut.wait()
    assert result.outcome is RunOutcome.GAVE_UP and result.write is None
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_id"]) == ("OutcomeUnknown", result.attempt_id)
    # The baseline was recorded before cutoff 2; nothing after it.
    assert worker.seed.event_kinds(job) == ["Claimed", "DeliveryEvidence", "DeliveryAuthorized", "ResolvedByRecovery"]
    assert worker.peer.files() == {} and worker.local_files() == []
