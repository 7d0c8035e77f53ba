"""Evidence records: each type reads back exactly what it wrote, and rows stored before the parsers
moved beside the serialisers still parse to the same bytes."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.store.types import ExpectedFile

ATTEMPT = "7f0c3a52-8a62-4c1e-9d0e-2b7e8f6a1c11"
NAME = "contacts-tenant-7-key-42.csv"
SHA = hashlib.sha256(b"contacts").digest()
OBSERVED = datetime(2024, 5, 17, 9, 30, 12, 345678, tzinfo=UTC)

# Written by the destination as it stood before evidence.py existed: a baseline, a receipt's
# evidence, a receipt, and the runner's outcome record that embeds the receipt.
STORED_BASELINE = (
    '{"ack":null,"attempt_id":"7f0c3a52-8a62-4c1e-9d0e-2b7e8f6a1c11","final_name":"contacts-tenant-7-key-42.csv",'
    '"hash_source":null,"mtime":null,"observed_at":"2024-05-17T09:30:12.345678+00:00","present":false,'
    '"sha256":null,"size":null,"stage":"baseline"}'
)
STORED_RECEIPT_EVIDENCE = (
    '{"ack":null,"attempt_id":"7f0c3a52-8a62-4c1e-9d0e-2b7e8f6a1c11","final_name":"contacts-tenant-7-key-42.csv",'
    '"hash_source":"check-file-name","mtime":1715938212,"observed_at":"2024-05-17T09:30:12.345678+00:00",'
    '"present":true,"sha256":"aa5af4084f3746bb29a29fd6ccc017a7dd49ca3b79dbeb2ec8fdbcd1ca3c50ce","size":200000,'
    '"stage":"receipt"}'
)
STORED_RECEIPT = (
    '{"ack":null,"attempt_id":"7f0c3a52-8a62-4c1e-9d0e-2b7e8f6a1c11","final_name":"contacts-tenant-7-key-42.csv",'
    '"hash_source":"check-file-name","mtime":1715938212,"observed_at":"2024-05-17T09:30:12.345678+00:00",'
    '"overwrote":false,"present":true,"proof":"checksum",'
    '"sha256":"aa5af4084f3746bb29a29fd6ccc017a7dd49ca3b79dbeb2ec8fdbcd1ca3c50ce","size":200000,"stage":"receipt"}'
)


def receipt_listing(**changes: object) -> Listing:
    fields: dict[str, object] = dict(final_name=NAME, present=True, size=200_000, mtime=1_715_938_212, sha256=SHA,
                                     hash_source="check-file-name", observed_at=OBSERVED)
    fields.update(changes)
    return Listing(**fields)  # type: ignore[arg-type]


def test_a_baseline_stored_before_the_move_parses_and_serialises_to_the_same_bytes() -> None:
    evidence = Evidence.from_detail(STORED_BASELINE)

    assert evidence == Evidence(EvidenceStage.BASELINE, Listing(final_name=NAME, present=False), ATTEMPT)
    assert evidence.listing.observed_at == OBSERVED
    assert evidence.to_detail() == STORED_BASELINE


def test_a_receipts_evidence_stored_before_the_move_parses_and_serialises_to_the_same_bytes() -> None:
    evidence = Evidence.from_detail(STORED_RECEIPT_EVIDENCE)

    assert evidence == Evidence(EvidenceStage.RECEIPT, receipt_listing(), ATTEMPT)
    assert evidence.to_detail() == STORED_RECEIPT_EVIDENCE


def test_a_receipt_stored_before_the_move_parses_and_serialises_to_the_same_bytes() -> None:
    receipt = Receipt.from_detail(STORED_RECEIPT)

    assert receipt.proof is Proof.CHECKSUM and receipt.overwrote is False
    assert receipt.evidence == Evidence(EvidenceStage.RECEIPT, receipt_listing(), ATTEMPT)
    assert receipt.to_detail() == STORED_RECEIPT


@pytest.mark.parametrize("listing", [
    Listing(final_name=NAME, present=False),
    Listing(final_name=NAME, present=False, ack="ab" * 32),
    receipt_listing(),
    receipt_listing(sha256=None, hash_source=None, ack=SHA.hex()),
    Listing(final_name=NAME, present=True, size=None, mtime=7),
], ids=["absent", "acknowledged-and-moved-away", "hashed", "acknowledged", "a-directory"])
def test_every_listing_reads_back_as_itself_with_its_observation_time(listing: Listing) -> None:
    parsed = Listing.from_dict(json.loads(json.dumps(listing.as_dict())))

    assert parsed == listing
    assert parsed.observed_at == listing.observed_at


@pytest.mark.parametrize("stage", list(EvidenceStage))
def test_evidence_of_every_stage_reads_back_as_itself(stage: EvidenceStage) -> None:
    evidence = Evidence(stage, receipt_listing(), ATTEMPT)

    assert Evidence.from_detail(evidence.to_detail()) == evidence


def test_evidence_without_an_attempt_reads_back_without_one() -> None:
    evidence = Evidence(EvidenceStage.INSPECTED, Listing(final_name=NAME, present=False))

    assert Evidence.from_detail(evidence.to_detail()).attempt_id is None


@pytest.mark.parametrize("proof", [Proof.NAME_AND_SIZE, Proof.CHECKSUM, Proof.ACKNOWLEDGMENT])
@pytest.mark.parametrize("overwrote", [False, True])
def test_a_receipt_reads_back_as_itself(proof: Proof, overwrote: bool) -> None:
    receipt = Receipt(proof, overwrote, Evidence(EvidenceStage.RECEIPT, receipt_listing(), ATTEMPT))

    assert Receipt.from_detail(receipt.to_detail()) == receipt
    assert Receipt.from_dict(receipt.as_dict()) == receipt


def test_a_receipts_detail_is_its_evidence_with_the_proof_and_overwrite_added() -> None:
    evidence = Evidence(EvidenceStage.RECEIPT, receipt_listing(), ATTEMPT)
    receipt = Receipt(Proof.CHECKSUM, False, evidence)

    assert json.loads(receipt.to_detail()) == {**json.loads(evidence.to_detail()), "proof": "checksum",
                                               "overwrote": False}


def test_an_empty_hash_is_read_as_no_hash() -> None:
    assert Listing.from_dict({**receipt_listing().as_dict(), "sha256": ""}).sha256 is None


def test_a_listing_without_an_observation_time_is_observed_when_parsed() -> None:
    payload = receipt_listing().as_dict()
    del payload["observed_at"]

    assert Listing.from_dict(payload) == receipt_listing()


@pytest.mark.parametrize("damage", [
    {"final_name": None},
    {"present": "yes"},
    {"present": 1},
    {"size": "200000"},
    {"size": True},
    {"size": 1.5},
    {"mtime": "yesterday"},
    {"sha256": "not hex"},
    {"sha256": "abcd"},
    {"sha256": 12},
    {"ack": 7},
    {"hash_source": ["read-back"]},
    {"observed_at": "noon"},
], ids=lambda damage: next(iter(damage)) + "=" + repr(next(iter(damage.values()))))
def test_a_listing_with_a_wrongly_typed_field_is_refused_rather_than_misread(damage: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Listing.from_dict({**receipt_listing().as_dict(), **damage})


@pytest.mark.parametrize("missing", ["final_name", "present"])
def test_a_listing_without_its_name_or_presence_is_refused(missing: str) -> None:
    payload = receipt_listing().as_dict()
    del payload[missing]

    with pytest.raises(ValueError):
        Listing.from_dict(payload)


@pytest.mark.parametrize("detail", [
    "", "not json", "[]", "null", '"baseline"',
    STORED_BASELINE.replace('"stage":"baseline"', '"stage":"outcome"'),
    STORED_BASELINE.replace('"stage":"baseline"', '"stage":null'),
    STORED_BASELINE.replace('"attempt_id":"7f0c3a52-8a62-4c1e-9d0e-2b7e8f6a1c11"', '"attempt_id":7'),
], ids=["empty", "not-json", "a-list", "null", "a-string", "an-outcome-record", "no-stage", "a-numeric-attempt"])
def test_a_detail_that_is_not_an_evidence_record_is_refused(detail: str) -> None:
    with pytest.raises(ValueError):
        Evidence.from_detail(detail)


def test_a_receipt_without_its_proof_or_with_an_unknown_one_is_refused() -> None:
    with pytest.raises(ValueError):
        Receipt.from_detail(STORED_RECEIPT_EVIDENCE)
    with pytest.raises(ValueError):
        Receipt.from_detail(STORED_RECEIPT.replace('"proof":"checksum"', '"proof":"hearsay"'))
    with pytest.raises(ValueError):
        Receipt.from_detail(STORED_RECEIPT.replace('"overwrote":false', '"overwrote":"no"'))


def test_a_listing_ties_to_the_expected_file_only_as_far_as_its_evidence_goes() -> None:
    expected = ExpectedFile(name=NAME, size=200_000, sha256=SHA)

    assert receipt_listing().proof_for(expected) is Proof.CHECKSUM
    assert receipt_listing(sha256=None).proof_for(expected) is Proof.NAME_AND_SIZE
    assert receipt_listing(sha256=None, ack="00" * 32).proof_for(expected) is Proof.NONE
    assert Listing(final_name=NAME, present=False, ack=SHA.hex()).proof_for(expected) is Proof.ACKNOWLEDGMENT
    assert receipt_listing(size=199_999).proof_for(expected) is Proof.NONE
    assert receipt_listing(sha256=b"\x01" * 32).contradicts(expected)
