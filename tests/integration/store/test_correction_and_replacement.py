"""A correction of the original to Completed and the replacement's cutoff 2, in both lock orders:
cutoff 2's FOR SHARE on the original conflicts with the correction's update, so whichever commits
first makes the other wait, and the one that waited re-checks."""

from __future__ import annotations

import pytest

from app.store import export
from app.store.types import AuthorizationResult, FailureCode, Role, Status, WriteResult
from tests.factories import Job
from tests.factories_more import WORKER, States
from tests.support import Background, wait_until_blocked


@pytest.fixture
def states(seed) -> States:
    return States(seed)


@pytest.fixture
def reconciler(connect_as):
    return connect_as(Role.RECONCILER)


def _correct_to_completed(reconciler, original: Job) -> bool:
    return export.correct(reconciler, tenant_id=original.tenant_id, job_id=original.id,
                            attempt_id=original.attempt_id, recorded_status=Status.FAILED,
                            corrected_status=Status.COMPLETED, failure_reason=None,
                            evidence_ref="partner ack 4711", why="the partner acknowledged the original's file",
                            corrected_by="ops-carol")


def _authorize(app_db, seed, replacement: Job, original: Job) -> AuthorizationResult:
    return export.authorize_delivery(app_db, job_id=replacement.id, tenant_id=replacement.tenant_id,
                                   attempt_id=replacement.attempt_id, expected=seed.expected(replacement),
                                   replaces_job_id=original.id)


@pytest.mark.parametrize("replacement_state", ["queued", "running"])
def test_a_correction_committed_before_cutoff_2_makes_it_report_original_completed_and_nothing_is_sent(
        states, seed, admin, app_db, reconciler, replacement_state):
    original = states.failed(FailureCode.NOT_DELIVERED)
    replacement = states.replacement(original)
    if replacement_state == "running":
        replacement = seed.running(replacement)

    assert _correct_to_completed(reconciler, original)
    if replacement_state == "queued":
        # The claim deliberately does not check the original: only cutoff 2 has an attempt to record the refusal.
        replacement = seed.running(replacement)
    cutoff = _authorize(app_db, seed, replacement, original)

    assert cutoff is AuthorizationResult.ORIGINAL_COMPLETED
    assert seed.status(replacement) is Status.RUNNING
    assert export.finish_failed(app_db, job_id=replacement.id, attempt_id=replacement.attempt_id, worker_id=WORKER,
                              failure_reason=FailureCode.ORIGINAL_DELIVERED) is WriteResult.WRITTEN
    row = seed.row(replacement)
    assert (row["status"], row["failure_reason"]) == ("Failed", "OriginalDelivered")
    assert (row["delivery_authorized_at"], row["expected_file_name"]) == (None, None)
    assert seed.event_kinds(replacement) == ["Claimed", "Failed"]
    assert seed.status(original) is Status.COMPLETED


def test_a_held_cutoff_2_makes_the_correction_wait_then_the_correction_succeeds(
        states, seed, admin, connect_as, reconciler):
    original = states.failed(FailureCode.NOT_DELIVERED)
    replacement = seed.running(states.replacement(original))
    worker = connect_as(Role.APP)

    with worker.transaction():
        assert export.try_authorize_delivery(worker, job_id=replacement.id, tenant_id=replacement.tenant_id,
                                           attempt_id=replacement.attempt_id, expected=seed.expected(replacement),
                                           replaces_job_id=original.id) == 1
        correction = Background(lambda: _correct_to_completed(reconciler, original))
        wait_until_blocked(admin, reconciler, by=worker)
        assert seed.status(original) is Status.FAILED
    corrected = correction.result()

    assert corrected is True
    assert seed.status(original) is Status.COMPLETED
    assert seed.event_kinds(original)[-1] == "Corrected"
    # Past cutoff 2 the replacement's own final-name check governs its upload; the row stays Delivering.
    assert seed.status(replacement) is Status.DELIVERING
    assert seed.event_kinds(replacement) == ["Claimed", "DeliveryAuthorized"]
