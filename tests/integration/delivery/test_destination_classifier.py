"""The delivery classifier: Failed only on proof the final name was never written, else unknown.

Pure functions, no server: each case states the stage, what the exception was and what a fresh
listing showed.
"""

from __future__ import annotations

import asyncio

import paramiko
import pytest

from app.delivery.classifier import Failed, Stage, Unknown, classify, describe
from app.delivery.evidence import Listing
from app.store.types import FailureCode

ABSENT = Listing(final_name="f.csv", present=False)
PRESENT = Listing(final_name="f.csv", present=True, size=10, mtime=1)


def test_a_cut_mid_upload_with_a_fresh_listing_matching_the_baseline_is_not_delivered() -> None:
    outcome = classify(EOFError(), stage=Stage.UPLOAD, baseline=ABSENT, fresh=ABSENT)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED


def test_a_cut_mid_upload_without_a_fresh_listing_is_unknown() -> None:
    assert isinstance(classify(EOFError(), stage=Stage.UPLOAD, baseline=ABSENT, fresh=None), Unknown)


def test_a_cut_mid_upload_after_which_the_final_name_changed_is_unknown() -> None:
    assert isinstance(classify(EOFError(), stage=Stage.UPLOAD, baseline=ABSENT, fresh=PRESENT), Unknown)


@pytest.mark.parametrize(
    "exc",
    [
        paramiko.SSHException("Server connection dropped: "),
        TimeoutError("timed out"),
        EOFError(),
        ConnectionResetError(104, "reset"),
    ],
    ids=["lost-reply", "timeout", "eof", "reset"],
)
def test_an_interrupted_rename_is_unknown_even_when_the_final_name_looks_untouched(exc: BaseException) -> None:
    # The server may still perform a rename it received: an absent file is not evidence either way.
    assert isinstance(classify(exc, stage=Stage.RENAME, baseline=ABSENT, fresh=ABSENT), Unknown)


def test_a_refused_rename_with_a_fresh_listing_matching_the_baseline_is_not_delivered() -> None:
    outcome = classify(OSError("Failure"), stage=Stage.RENAME, baseline=PRESENT, fresh=PRESENT, rename_refused=True)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED


def test_a_refused_rename_onto_a_name_that_appeared_since_the_baseline_is_unknown() -> None:
    outcome = classify(OSError("Failure"), stage=Stage.RENAME, baseline=ABSENT, fresh=PRESENT, rename_refused=True)

    assert isinstance(outcome, Unknown)


def test_a_failure_while_confirming_after_the_rename_is_unknown() -> None:
    assert isinstance(classify(TimeoutError(), stage=Stage.CONFIRM, baseline=ABSENT, fresh=ABSENT), Unknown)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), asyncio.CancelledError(), SystemExit(1)])
def test_cancellation_during_the_upload_is_unknown(exc: BaseException) -> None:
    for stage in (Stage.UPLOAD, Stage.RENAME, Stage.CONFIRM, Stage.UNKNOWN):
        assert isinstance(classify(exc, stage=stage, baseline=ABSENT, fresh=ABSENT), Unknown)


def test_a_failure_before_any_write_was_sent_is_not_delivered() -> None:
    for stage in (Stage.CONNECT, Stage.BASELINE):
        outcome = classify(paramiko.AuthenticationException("Authentication failed."), stage=stage)
        assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED


def test_an_exception_escaping_from_an_unknown_stage_is_unknown() -> None:
    assert isinstance(classify(RuntimeError("boom"), stage=Stage.UNKNOWN), Unknown)


def test_details_never_carry_a_secret_even_if_a_library_echoes_one() -> None:
    outcome = classify(RuntimeError("auth with hunter2 failed"), stage=Stage.RENAME, redact=["hunter2"])

    assert "hunter2" not in outcome.detail
    assert "***" in outcome.detail


def test_descriptions_are_short_and_name_timeouts_plainly() -> None:
    assert describe(TimeoutError()) == "Timeout"
    assert len(describe(RuntimeError("x" * 10_000))) < 400


def test_listings_that_differ_only_in_when_they_were_observed_are_the_same() -> None:
    later = Listing(final_name="f.csv", present=True, size=10, mtime=1)
    assert later.same_as(PRESENT)
    assert not Listing(final_name="f.csv", present=True, size=10, mtime=2).same_as(PRESENT)
    assert not Listing(final_name="f.csv", present=False, ack="ab").same_as(ABSENT)
