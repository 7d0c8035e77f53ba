"""Recovery's and reconciliation's verdicts, as pure functions: Completed only on evidence that ties
the expected file to this attempt, OutcomeUnknown otherwise, never Failed."""

from __future__ import annotations

import hashlib
import json

import pytest

from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.verdicts import (
    AttemptEvidence,
    Resolution,
    decide_delivery,
    expected_file,
    parse_evidence,
    proves_delivery,
)
from app.store.types import ExpectedFile

ATTEMPT = "att-1"
NAME = "contacts-tenant-7-key-42.csv"
DATA = b"email,full_name\nada@example.com,Ada\n"
EXPECTED = ExpectedFile(name=NAME, size=len(DATA), sha256=hashlib.sha256(DATA).digest())
ABSENT = Listing(final_name=NAME, present=False)
#: The original's delivery, already there when a replacement listed the name.
ORIGINALS = Listing(final_name=NAME, present=True, size=999, mtime=1_700_000_000)
#: The expected name and size, no hash: what a server without hashing shows after the rename.
NAME_AND_SIZE = Listing(final_name=NAME, present=True, size=EXPECTED.size, mtime=1_700_000_100)
CHECKSUM = Listing(final_name=NAME, present=True, size=EXPECTED.size, mtime=1_700_000_100, sha256=EXPECTED.sha256,
                   hash_source="check-file-name")


def evidence(baseline: Listing | None, *observations: tuple[EvidenceStage, Listing]) -> AttemptEvidence:
    details = [Evidence(EvidenceStage.BASELINE, baseline, ATTEMPT).to_detail()] if baseline is not None else []
    details += [Evidence(stage, listing, ATTEMPT).to_detail() for stage, listing in observations]
    return parse_evidence(details)


def decide(evidence: AttemptEvidence, *, replacement: bool = False, listing: Listing | None = None,
           inspect_error: str | None = None, expected: ExpectedFile | None = EXPECTED):
    return decide_delivery(expected, replacement=replacement, evidence=evidence, listing=listing,
                           inspect_error=inspect_error)


# -- decide_delivery ---------------------------------------------------------------------------------


def test_an_original_whose_receipt_shows_the_name_and_size_over_an_absent_baseline_is_completed() -> None:
    verdict = decide(evidence(ABSENT, (EvidenceStage.RECEIPT, NAME_AND_SIZE)))

    assert verdict.resolution is Resolution.COMPLETED
    assert verdict.summary == "receipt shows the expected file (name-and-size)"


def test_an_original_without_a_recorded_baseline_is_completed_by_a_listing_of_its_unique_name() -> None:
    verdict = decide(evidence(None), listing=NAME_AND_SIZE)

    assert verdict.resolution is Resolution.COMPLETED
    assert verdict.summary == "destination shows the expected file (name-and-size)"


def test_a_replacement_without_a_recorded_baseline_stays_unknown_even_with_a_matching_checksum() -> None:
    verdict = decide(evidence(None, (EvidenceStage.RECEIPT, CHECKSUM)), replacement=True, listing=CHECKSUM)

    assert verdict.resolution is Resolution.OUTCOME_UNKNOWN
    assert "replacement without a recorded baseline" in verdict.summary


def test_a_replacement_with_its_baseline_is_completed_by_a_checksum_over_the_originals_file() -> None:
    verdict = decide(evidence(ORIGINALS), replacement=True, listing=CHECKSUM)

    assert verdict.resolution is Resolution.COMPLETED and verdict.summary.endswith("(checksum)")


def test_a_refused_rename_keeps_name_and_size_from_proving_the_delivery() -> None:
    # The name was taken before this attempt's rename: a file of the right size there is someone else's.
    refused = evidence(ABSENT, (EvidenceStage.RENAME_REFUSED, NAME_AND_SIZE))

    assert refused.rename_refused
    assert decide(refused, listing=NAME_AND_SIZE).resolution is Resolution.OUTCOME_UNKNOWN
    assert decide(refused, listing=CHECKSUM).resolution is Resolution.COMPLETED


def test_a_stale_acknowledgment_already_there_at_the_baseline_proves_nothing() -> None:
    stale = Listing(final_name=NAME, present=False, ack=EXPECTED.sha256_hex)
    moved_away = Listing(final_name=NAME, present=False, ack=EXPECTED.sha256_hex)

    assert decide(evidence(stale), listing=moved_away).resolution is Resolution.OUTCOME_UNKNOWN
    assert decide(evidence(ABSENT), listing=moved_away).resolution is Resolution.COMPLETED


def test_a_file_whose_size_contradicts_the_expected_one_is_unknown_and_said_so() -> None:
    other = Listing(final_name=NAME, present=True, size=EXPECTED.size + 1, mtime=1_700_000_100)

    verdict = decide(evidence(ABSENT, (EvidenceStage.RECEIPT, other)), listing=other)

    assert verdict.resolution is Resolution.OUTCOME_UNKNOWN
    assert verdict.summary.endswith(
        f"destination shows {NAME} with size {EXPECTED.size + 1}, not proven this attempt's")


def test_no_expected_file_recorded_at_cutoff_2_is_unknown() -> None:
    verdict = decide(evidence(ABSENT), listing=CHECKSUM, expected=None)

    assert verdict.resolution is Resolution.OUTCOME_UNKNOWN
    assert verdict.summary == "no expected file recorded at cutoff 2"


@pytest.mark.parametrize("listing, inspect_error, seen", [
    (None, "TimeoutError", "destination inspection failed: TimeoutError"),
    (None, None, "destination not inspected"),
    (ABSENT, None, f"destination shows no {NAME}"),
], ids=["inspection-failed", "not-inspected", "absent"])
def test_an_unproven_delivery_is_unknown_never_failed_and_says_what_was_seen(
    listing: Listing | None, inspect_error: str | None, seen: str
) -> None:
    verdict = decide(evidence(ABSENT), listing=listing, inspect_error=inspect_error)

    assert verdict.resolution is Resolution.OUTCOME_UNKNOWN
    assert verdict.summary == f"no evidence matches the expected file; {seen}"


# -- proves_delivery ---------------------------------------------------------------------------------


def test_a_matching_checksum_proves_the_delivery_over_any_baseline() -> None:
    assert proves_delivery(CHECKSUM, EXPECTED, ABSENT, weak_allowed=False) is Proof.CHECKSUM
    assert proves_delivery(CHECKSUM, EXPECTED, ORIGINALS, weak_allowed=False) is Proof.CHECKSUM


def test_name_and_size_prove_the_delivery_only_over_an_absent_baseline_and_when_allowed() -> None:
    assert proves_delivery(NAME_AND_SIZE, EXPECTED, ABSENT, weak_allowed=True) is Proof.NAME_AND_SIZE
    assert proves_delivery(NAME_AND_SIZE, EXPECTED, ABSENT, weak_allowed=False) is Proof.NONE
    assert proves_delivery(NAME_AND_SIZE, EXPECTED, ORIGINALS, weak_allowed=True) is Proof.NONE


def test_a_listing_unchanged_from_the_baseline_proves_nothing() -> None:
    assert proves_delivery(CHECKSUM, EXPECTED, CHECKSUM, weak_allowed=True) is Proof.NONE


def test_a_listing_of_another_name_proves_nothing() -> None:
    elsewhere = Listing(final_name="other.csv", present=True, size=EXPECTED.size, sha256=EXPECTED.sha256)

    assert proves_delivery(elsewhere, EXPECTED, ABSENT, weak_allowed=True) is Proof.NONE


def test_a_contradicting_hash_proves_nothing_even_with_the_expected_size() -> None:
    wrong = Listing(final_name=NAME, present=True, size=EXPECTED.size, sha256=b"\x01" * 32)

    assert proves_delivery(wrong, EXPECTED, ABSENT, weak_allowed=True) is Proof.NONE


def test_an_acknowledgment_newer_than_the_baselines_proves_the_delivery() -> None:
    older = Listing(final_name=NAME, present=False, ack="00" * 32)
    acknowledged = Listing(final_name=NAME, present=False, ack=EXPECTED.sha256_hex)

    assert proves_delivery(acknowledged, EXPECTED, older, weak_allowed=False) is Proof.ACKNOWLEDGMENT
    assert proves_delivery(acknowledged, EXPECTED, acknowledged, weak_allowed=False) is Proof.NONE


# -- parse_evidence ----------------------------------------------------------------------------------


def test_parsing_keeps_the_first_baseline_and_every_later_observation_in_order() -> None:
    later_baseline = Listing(final_name=NAME, present=True, size=1, mtime=1)
    parsed = evidence(ABSENT, (EvidenceStage.INTERRUPTED, ORIGINALS), (EvidenceStage.BASELINE, later_baseline),
                      (EvidenceStage.RECEIPT, CHECKSUM), (EvidenceStage.INSPECTED, NAME_AND_SIZE))

    assert parsed.baseline == ABSENT
    assert parsed.observations == (("interrupted", ORIGINALS), ("receipt", CHECKSUM), ("inspected", NAME_AND_SIZE))
    assert not parsed.rename_refused


def test_an_outcome_record_contributes_its_receipts_listing() -> None:
    receipt = Receipt(Proof.CHECKSUM, False, Evidence(EvidenceStage.RECEIPT, CHECKSUM, ATTEMPT))
    completed = json.dumps({"stage": "outcome", "attempt_id": ATTEMPT, "outcome": "Completed",
                            "receipt": receipt.as_dict()}, separators=(",", ":"), sort_keys=True)
    failed = json.dumps({"stage": "outcome", "attempt_id": ATTEMPT, "outcome": "Failed", "code": "NotDelivered",
                         "detail": "no write was sent (connect): Timeout"})

    parsed = parse_evidence([failed, completed])

    assert parsed == AttemptEvidence(None, (("receipt", CHECKSUM),), False)


def test_details_that_are_not_evidence_records_are_skipped() -> None:
    good = Evidence(EvidenceStage.RECEIPT, CHECKSUM, ATTEMPT).to_detail()
    damaged = good.replace(f'"size":{EXPECTED.size}', '"size":"lots"')
    foreign_stage = good.replace('"stage":"receipt"', '"stage":"rumour"')
    outcome_without_proof = json.dumps({"stage": "outcome", "receipt": json.loads(good)})

    parsed = parse_evidence([None, "", "free text", "[1, 2]", "42", damaged, foreign_stage, outcome_without_proof,
                             '{"stage": "outcome", "receipt": "yes"}', good])

    assert parsed == AttemptEvidence(None, (("receipt", CHECKSUM),), False)


def test_expected_file_is_none_unless_cutoff_2_recorded_a_name_a_size_and_a_full_digest() -> None:
    assert expected_file(NAME, EXPECTED.size, EXPECTED.sha256) == EXPECTED
    assert expected_file(None, EXPECTED.size, EXPECTED.sha256) is None
    assert expected_file(NAME, None, EXPECTED.sha256) is None
    assert expected_file(NAME, EXPECTED.size, None) is None
    assert expected_file(NAME, EXPECTED.size, EXPECTED.sha256[:16]) is None


# -- completion markers -------------------------------------------------------------------------------

MANIFEST = b'{"name":"contacts-tenant-7-key-42.csv","rows":1}\n'
MARKED = ExpectedFile(name=NAME, size=EXPECTED.size, sha256=EXPECTED.sha256, marker_name=NAME + ".manifest.json",
                      marker=MANIFEST)


def _with_marker(listing: Listing, content: bytes | None) -> Listing:
    return Listing(final_name=listing.final_name, present=listing.present, size=listing.size, mtime=listing.mtime,
                   sha256=listing.sha256, hash_source=listing.hash_source,
                   marker=None if content is None else hashlib.sha256(content).hexdigest())


def test_a_file_whose_completion_marker_is_missing_is_unknown_and_the_summary_says_the_marker_is_missing() -> None:
    verdict = decide(evidence(ABSENT, (EvidenceStage.RECEIPT, CHECKSUM)), listing=CHECKSUM, expected=MARKED)

    assert verdict.resolution is Resolution.OUTCOME_UNKNOWN
    assert verdict.summary.endswith(f"shows {NAME} but not its completion marker {NAME}.manifest.json")


def test_a_marker_whose_content_is_not_the_recorded_one_proves_nothing() -> None:
    other = _with_marker(CHECKSUM, b'{"name":"someone else"}\n')

    assert decide(evidence(ABSENT, (EvidenceStage.RECEIPT, other)), expected=MARKED).resolution \
        is Resolution.OUTCOME_UNKNOWN


def test_the_file_with_its_recorded_marker_is_completed_by_the_same_proof_as_without_one() -> None:
    marked = _with_marker(NAME_AND_SIZE, MANIFEST)

    verdict = decide(evidence(ABSENT, (EvidenceStage.RECEIPT, NAME_AND_SIZE), (EvidenceStage.RECEIPT, marked)),
                     expected=MARKED)

    assert verdict.resolution is Resolution.COMPLETED
    assert verdict.summary == "receipt shows the expected file (name-and-size)"


def test_a_listing_with_a_marker_round_trips_and_one_without_serialises_as_it_always_did() -> None:
    marked = _with_marker(CHECKSUM, MANIFEST)

    assert Listing.from_dict(marked.as_dict()) == marked
    assert "marker" not in CHECKSUM.as_dict()
    assert expected_file(NAME, EXPECTED.size, EXPECTED.sha256, MARKED.marker_name, MANIFEST) == MARKED
    assert expected_file(NAME, EXPECTED.size, EXPECTED.sha256, MARKED.marker_name, None) is None
