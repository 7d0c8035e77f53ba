"""Replacements through the runner: a correction of the original to Completed refuses the replacement
at cutoff 2 (queued or already building), and a replacement that finds the original's delivery under
the shared final name uploads nothing."""

from __future__ import annotations

import dataclasses

import pytest

from app.actors.runner import RunOutcome
from app.delivery.classifier import Unknown
from app.store import export
from app.store.types import Role, Status, WriteResult
from tests.factories import Job
from tests.factories_more import States
from tests.fixtures.worker import Gate, after_cutoff_2, insert_destination
from tests.support import Background


@pytest.fixture
def reconciler(connect_as):
    return connect_as(Role.RECONCILER)


def _failed_original(worker) -> Job:
    """An original whose build failed: nothing was finalized, so it may be replaced."""
    job = worker.queued()

    def broken(stop):
        raise RuntimeError("disk full")

    assert worker.runner(checkpoint=broken).run(job.id).outcome is RunOutcome.FAILED
    row = worker.seed.row(job)
    return Job(job.id, job.tenant_id, job.destination_id, job.delivery_key, row["attempt_id"])


def _correct_to_completed(reconciler, original: Job) -> None:
    assert export.correct(reconciler, tenant_id=original.tenant_id, job_id=original.id,
                            attempt_id=original.attempt_id, recorded_status=Status.FAILED,
                            corrected_status=Status.COMPLETED, failure_reason=None,
                            evidence_ref="partner-ticket-42", why="the partner has the file", corrected_by="ops-carol")


def test_a_replacement_building_when_its_original_is_corrected_to_completed_ends_original_delivered_sending_nothing(
        worker, reconciler):
    original = _failed_original(worker)
    replacement = States(worker.seed).replacement(original)
    gate = Gate(on_reach=lambda: _correct_to_completed(reconciler, original))
    runner = worker.runner(checkpoint=gate)
    run = Background(lambda: runner.run(replacement.id))
    assert gate.reached.wait(60)
    gate.open()
    result = run.result()

    assert (result.outcome, result.write) == (RunOutcome.FAILED, WriteResult.WRITTEN)
    row = worker.seed.row(replacement)
    assert (row["status"], row["failure_reason"], row["delivery_authorized_at"]) == ("Failed", "OriginalDelivered",
                                                                                     None)
    assert worker.seed.status(original) is Status.COMPLETED
    assert worker.peer.files() == {} and worker.local_files() == []


def test_a_queued_replacement_whose_original_was_corrected_to_completed_ends_original_delivered_sending_nothing(
        worker, reconciler):
    original = _failed_original(worker)
    replacement = States(worker.seed).replacement(original)
    _correct_to_completed(reconciler, original)

    result = worker.runner().run(replacement.id)

    assert result.outcome is RunOutcome.FAILED
    assert worker.seed.row(replacement)["failure_reason"] == "OriginalDelivered"
    assert worker.peer.files() == {}


def _reply_lost(delivered):
    """What a lost rename reply leaves the worker with, after delivering for real."""
    return Unknown("the rename's reply was lost")


@pytest.mark.parametrize("read_back, code", [(True, "OriginalDelivered"), (False, "FinalNameOccupied")])
def test_a_replacement_that_finds_a_file_under_the_final_name_uploads_nothing_and_says_whose_it_is_before_cutoff_2(
        worker, read_back, code):
    # read_back: the contract lets the worker hash the file, which identifies it as the original's.
    destination_id = insert_destination(worker.conn, worker.tenant_id,
                                        dataclasses.replace(worker.peer.config, read_back=read_back))
    original = worker.queued(destination_id)
    environ = worker.peer.environ
    first = worker.runner(destination_for=after_cutoff_2(environ, lambda: None, outcome=_reply_lost))
    assert first.run(original.id).delivery is Status.OUTCOME_UNKNOWN
    final = export.final_name(original.delivery_key)
    delivered = worker.peer.files()
    assert list(delivered) == [final]
    replacement = States(worker.seed).replacement(original)

    result = worker.runner().run(replacement.id)

    # The baseline is taken while the replacement is Running: it ends there, never authorized.
    assert (result.outcome, result.delivery, result.write) == (RunOutcome.FAILED, None, WriteResult.WRITTEN)
    row = worker.seed.row(replacement)
    assert (row["status"], row["failure_reason"], row["delivery_authorized_at"]) == ("Failed", code, None)
    kinds = worker.seed.event_kinds(replacement)
    assert kinds[0] == "Claimed" and kinds[-1] == "Failed" and "DeliveryAuthorized" not in kinds
    assert worker.peer.files() == delivered   # untouched, and nothing uploaded beside it
    assert worker.seed.status(original) is Status.OUTCOME_UNKNOWN
