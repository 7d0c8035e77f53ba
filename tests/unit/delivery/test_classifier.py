"""The classifier per stage, and the outcomes it may build: Failed only on proof that the final name
was never written, with one of the store's failure codes a delivery can end with."""

from __future__ import annotations

import paramiko
import pytest

from app.delivery.classifier import Completed, Failed, Stage, Unknown, classify, describe
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.store.types import FailureCode

ABSENT = Listing(final_name="f.csv", present=False)
PRESENT = Listing(final_name="f.csv", present=True, size=10, mtime=1)
SECRET = "correct horse battery staple"


@pytest.mark.parametrize("stage", [Stage.CONNECT, Stage.BASELINE])
@pytest.mark.parametrize("exc", [TimeoutError("timed out"), paramiko.AuthenticationException("Authentication failed."),
                                 paramiko.SSHException("Server connection dropped"), KeyboardInterrupt()],
                         ids=["timeout", "auth", "dropped", "interrupt"])
def test_anything_that_stops_a_delivery_before_a_write_was_sent_is_not_delivered(stage: Stage,
                                                                                    exc: BaseException) -> None:
    outcome = classify(exc, stage=stage)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert outcome.status == "Failed"


def test_an_upload_cut_short_whose_fresh_listing_equals_the_baseline_is_not_delivered() -> None:
    outcome = classify(EOFError(), stage=Stage.UPLOAD, baseline=PRESENT,
                       fresh=Listing(final_name="f.csv", present=True, size=10, mtime=1))

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert "fresh listing matches the baseline" in outcome.detail


def test_an_upload_cut_short_without_a_baseline_to_compare_with_is_unknown() -> None:
    assert isinstance(classify(EOFError(), stage=Stage.UPLOAD, baseline=None, fresh=ABSENT), Unknown)


@pytest.mark.parametrize("exc", [paramiko.SSHException("Server connection dropped: "), TimeoutError(), EOFError()],
                         ids=["lost-reply", "timeout", "eof"])
def test_a_rename_without_a_reply_is_unknown_whatever_a_fresh_listing_shows(exc: BaseException) -> None:
    for fresh in (ABSENT, PRESENT, None):
        outcome = classify(exc, stage=Stage.RENAME, baseline=ABSENT, fresh=fresh)
        assert isinstance(outcome, Unknown) and outcome.status == "OutcomeUnknown"


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(1), GeneratorExit()])
def test_a_base_exception_during_the_upload_is_unknown(exc: BaseException) -> None:
    # It may have arrived anywhere, even after the rename was sent.
    outcome = classify(exc, stage=Stage.UPLOAD, baseline=ABSENT, fresh=ABSENT)

    assert isinstance(outcome, Unknown)
    assert outcome.detail.startswith("interrupted at upload: ")


def test_a_secret_a_library_echoes_is_redacted_from_the_detail_at_every_stage() -> None:
    exc = paramiko.AuthenticationException(f"password {SECRET!r} rejected")
    for stage in Stage:
        outcome = classify(exc, stage=stage, baseline=ABSENT, fresh=ABSENT, redact=[SECRET, ""])
        assert SECRET not in outcome.detail
        assert "***" in outcome.detail


def test_a_description_redacts_before_it_shortens_so_no_part_of_a_secret_survives() -> None:
    text = describe(RuntimeError("x" * 290 + SECRET), redact=[SECRET])

    assert SECRET[:10] not in text and text.endswith("***")


@pytest.mark.parametrize("code", [FailureCode.NOT_DELIVERED, FailureCode.FINAL_NAME_OCCUPIED,
                                  FailureCode.ORIGINAL_DELIVERED])
def test_a_failed_delivery_carries_one_of_the_stores_delivery_failure_codes(code: FailureCode) -> None:
    assert Failed(code, "why").code is code


@pytest.mark.parametrize("code", [FailureCode.BUILD_FAILED, FailureCode.ATTEMPTS_EXHAUSTED])
def test_a_failed_delivery_refuses_a_code_only_the_build_or_recovery_can_end_with(code: FailureCode) -> None:
    with pytest.raises(ValueError, match=code.value):
        Failed(code, "why")


def test_a_completed_delivery_carries_its_receipt() -> None:
    receipt = Receipt(Proof.CHECKSUM, False, Evidence(EvidenceStage.RECEIPT, PRESENT, "att-1"))

    assert Completed(receipt).receipt is receipt and Completed(receipt).status == "Completed"
