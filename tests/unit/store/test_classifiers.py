"""The store's pure decisions: why cutoff 2 did not visibly commit, read from a re-read of the row, and
what a cancellation request means for a job in each status."""

from __future__ import annotations

import uuid

import pytest

from app.store.cancellation import classify
from app.store.export import classify_refusal
from app.store.types import AuthorizationResult, CancellationOutcome, Ownership, Status

ATTEMPT = uuid.uuid4()


def ownership(status: Status = Status.RUNNING, *, attempt_id: uuid.UUID | None = ATTEMPT, stop_requested: bool = False,
              lease_current: bool = True, original_status: Status | None = None) -> Ownership:
    return Ownership(status=status, attempt_id=attempt_id, stop_requested=stop_requested,
                     lease_current=lease_current, original_status=original_status)


# -- classify_refusal ---------------------------------------------------------------------------------


def test_a_job_that_can_no_longer_be_read_is_not_ours() -> None:
    assert classify_refusal(None, ATTEMPT) is AuthorizationResult.NOT_OWNER


@pytest.mark.parametrize("status", [Status.RUNNING, Status.DELIVERING])
@pytest.mark.parametrize("attempt_id", [uuid.uuid4(), None], ids=["another-attempt", "no-attempt"])
def test_a_job_owned_by_another_attempt_is_not_ours_whatever_its_status(status: Status,
                                                                        attempt_id: uuid.UUID | None) -> None:
    assert classify_refusal(ownership(status, attempt_id=attempt_id), ATTEMPT) is AuthorizationResult.NOT_OWNER


def test_our_attempt_found_delivering_means_the_authorization_committed_and_its_reply_was_lost() -> None:
    # Even with a stop request or a lapsed lease beside it: the committed write is what counts.
    assert classify_refusal(ownership(Status.DELIVERING), ATTEMPT) is AuthorizationResult.AUTHORIZED
    assert classify_refusal(ownership(Status.DELIVERING, stop_requested=True, lease_current=False),
                            ATTEMPT) is AuthorizationResult.AUTHORIZED


@pytest.mark.parametrize("status", [Status.QUEUED, Status.CANCELED, Status.REJECTED, Status.STOPPED, Status.FAILED,
                                    Status.COMPLETED, Status.OUTCOME_UNKNOWN])
def test_our_attempt_found_in_any_status_but_running_or_delivering_is_no_longer_ours(status: Status) -> None:
    assert classify_refusal(ownership(status), ATTEMPT) is AuthorizationResult.NOT_OWNER
    assert classify_refusal(ownership(status, stop_requested=True), ATTEMPT) is AuthorizationResult.NOT_OWNER


def test_a_stop_request_on_our_running_attempt_is_why_it_was_refused() -> None:
    # A stop request wins over an original completed meanwhile and over a lapsed lease.
    refused = ownership(stop_requested=True, lease_current=False, original_status=Status.COMPLETED)

    assert classify_refusal(refused, ATTEMPT) is AuthorizationResult.STOP_RECORDED


def test_a_replacement_whose_original_was_completed_is_refused_for_that() -> None:
    for lease_current in (True, False):
        refused = ownership(lease_current=lease_current, original_status=Status.COMPLETED)
        assert classify_refusal(refused, ATTEMPT) is AuthorizationResult.ORIGINAL_COMPLETED


@pytest.mark.parametrize("original_status", [None, Status.FAILED, Status.OUTCOME_UNKNOWN, Status.DELIVERING])
@pytest.mark.parametrize("lease_current", [False, True], ids=["expired", "renewed-since"])
def test_otherwise_our_running_attempts_lease_lapsed(original_status: Status | None, lease_current: bool) -> None:
    # Renewed between the refusal and the re-read looks the same: one renewal and one retry settle both.
    refused = ownership(lease_current=lease_current, original_status=original_status)

    assert classify_refusal(refused, ATTEMPT) is AuthorizationResult.LEASE_LAPSED


# -- cancellation.classify ----------------------------------------------------------------------------

EXPECTED_OUTCOME = {
    Status.QUEUED: CancellationOutcome.CANCELED_WHILE_QUEUED,
    Status.CANCELED: CancellationOutcome.ALREADY_CANCELED,
    Status.REJECTED: CancellationOutcome.ALREADY_ENDED,
    Status.STOPPED: CancellationOutcome.ALREADY_ENDED,
    Status.FAILED: CancellationOutcome.ALREADY_ENDED,
    Status.DELIVERING: CancellationOutcome.TOO_LATE,
    Status.COMPLETED: CancellationOutcome.TOO_LATE,
    Status.OUTCOME_UNKNOWN: CancellationOutcome.TOO_LATE,
}


def test_every_status_has_a_cancellation_outcome() -> None:
    assert set(EXPECTED_OUTCOME) | {Status.RUNNING} == set(Status)


@pytest.mark.parametrize("status", list(EXPECTED_OUTCOME))
@pytest.mark.parametrize("stop_already_requested", [False, True], ids=["first-request", "after-a-stop-request"])
def test_a_cancellation_of_a_job_not_running_is_decided_by_its_status_alone(status: Status,
                                                                           stop_already_requested: bool) -> None:
    assert classify(status, stop_already_requested) is EXPECTED_OUTCOME[status]


def test_the_first_cancellation_of_a_running_job_requests_a_stop() -> None:
    assert classify(Status.RUNNING, False) is CancellationOutcome.STOP_REQUESTED


def test_a_later_cancellation_of_a_running_job_finds_the_stop_already_requested() -> None:
    assert classify(Status.RUNNING, True) is CancellationOutcome.STOP_ALREADY_REQUESTED
