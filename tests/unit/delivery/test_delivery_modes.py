"""The delivery modes' rules as pure functions: what each needs and may do (``app.delivery.modes``), what
``destination check`` recommends from what a server allows, how the classifier ends an interrupted
delivery in each, and what recovery and reconciliation conclude from the evidence each records."""

from __future__ import annotations

import hashlib

import paramiko
import pytest

from app.delivery.classifier import Failed, Stage, Unknown, classify
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.modes import DeliveryMode
from app.delivery.preflight import PROBES, Capabilities
from app.delivery.verdicts import Resolution, decide_delivery, parse_evidence
from app.store.types import ExpectedFile, FailureCause, FailureCode

ATTEMPT = "att-1"
NAME = "contacts-key-42.csv"
DATA = b"email,full_name\nada@example.com,Ada\n"
MARKER = b'{"name":"contacts-key-42.csv"}'
EXPECTED = ExpectedFile(NAME, len(DATA), hashlib.sha256(DATA).digest())
MARKED = ExpectedFile(NAME, len(DATA), hashlib.sha256(DATA).digest(), f"{NAME}.manifest.json", MARKER)
ABSENT = Listing(final_name=NAME, present=False)
PRESENT = Listing(final_name=NAME, present=True, size=len(DATA), mtime=1_700_000_100)


def renamed(expected: ExpectedFile = EXPECTED, *, size: int | None = None, marked: bool = False) -> Listing:
    return Listing(final_name=expected.name, present=True, size=expected.size if size is None else size,
                   marker=expected.marker_sha256_hex if marked else None)


def verdict(mode: DeliveryMode, *observations: tuple[EvidenceStage, Listing], baseline: Listing | None = ABSENT,
            expected: ExpectedFile = EXPECTED, listing: Listing | None = None, replacement: bool = False):
    details = [Evidence(EvidenceStage.BASELINE, baseline, ATTEMPT).to_detail()] if baseline is not None else []
    details += [Evidence(stage, observed, ATTEMPT).to_detail() for stage, observed in observations]
    return decide_delivery(expected, replacement=replacement, evidence=parse_evidence(details), listing=listing,
                           inspect_error=None, mode=mode)


def capabilities(**found: bool | None) -> Capabilities:
    every = dict.fromkeys(PROBES, True) | {"ingested": None}
    return Capabilities(found=every | found)


# -- the modes --------------------------------------------------------------------------------------


def test_each_mode_names_its_reason_its_one_irreversible_step_and_the_probes_it_needs() -> None:
    for mode in DeliveryMode:
        assert mode.reason and mode.irreversible_step
        assert set(mode.needs) <= set(PROBES) and "write" in mode.needs
    assert "exclusive create of the completion marker" in DeliveryMode.NO_RENAME.irreversible_step
    assert "stat" not in DeliveryMode.NO_STAT.needs and "rename" not in DeliveryMode.NO_RENAME.needs
    # No mode publishes without a guard against replacing a file it did not write.
    assert all(("rename_refuses_overwrite" in m.needs) is m.renames for m in DeliveryMode)
    assert "exclusive_create" in DeliveryMode.NO_RENAME.needs


def test_an_attempt_authorized_before_modes_were_recorded_was_delivered_in_standard() -> None:
    assert DeliveryMode.of(None) is DeliveryMode.STANDARD
    assert DeliveryMode.of("no-stat") is DeliveryMode.NO_STAT
    with pytest.raises(ValueError):
        DeliveryMode.of("fast")


# -- what destination check recommends -----------------------------------------------------------------


@pytest.mark.parametrize(("found", "recommended"), [
    ({}, DeliveryMode.STANDARD),
    ({"ingested": False}, DeliveryMode.STANDARD),
    ({"ingested": True}, DeliveryMode.QUICK_INGEST),
    ({"stat": False, "lstat": False, "list": False}, DeliveryMode.NO_STAT),
    ({"rename": False, "rename_refuses_overwrite": None, "posix_rename": None}, DeliveryMode.NO_RENAME),
    ({"rename_refuses_overwrite": False, "posix_rename": False}, DeliveryMode.NO_RENAME),
    ({"rename_refuses_overwrite": False, "exclusive_create": False}, None),
    ({"rename": False, "rename_refuses_overwrite": None, "stat": False}, None),
    ({"rename": False, "rename_refuses_overwrite": None, "ingested": True}, None),
    ({"write": False}, None),
], ids=["everything", "no-ingestion-seen", "quick-ingestion", "no-stat", "no-rename", "rename-overwrites",
        "only-overwrites", "no-rename-no-stat", "in-place-under-ingestion", "no-write"])
def test_the_check_recommends_the_mode_that_fits_and_none_where_every_way_could_overwrite(
        found: dict[str, bool | None], recommended: DeliveryMode | None) -> None:
    caps = capabilities(**found)

    assert caps.recommended is recommended
    assert caps.deliverable is (recommended is not None)
    assert caps.verdict.startswith(recommended.value if recommended else "none")


# -- the classifier, per mode --------------------------------------------------------------------------


def test_in_no_stat_an_upload_cut_before_the_rename_is_not_delivered_without_any_look() -> None:
    outcome = classify(EOFError(), stage=Stage.UPLOAD, baseline=Listing.not_looked(NAME), fresh=None,
                       mode=DeliveryMode.NO_STAT)

    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert outcome.cause is FailureCause.TRANSIENT


def test_in_no_stat_a_refused_rename_is_the_servers_answer_and_not_delivered() -> None:
    outcome = classify(OSError("Failure"), stage=Stage.RENAME, baseline=Listing.not_looked(NAME),
                       fresh=Listing.not_looked(NAME), rename_refused=True, mode=DeliveryMode.NO_STAT)

    assert isinstance(outcome, Failed) and outcome.cause is FailureCause.PERMANENT


@pytest.mark.parametrize("mode", list(DeliveryMode))
@pytest.mark.parametrize("exc", [paramiko.SSHException("Server connection dropped"), TimeoutError()])
def test_in_every_mode_an_irreversible_request_without_an_answer_is_unknown(
        mode: DeliveryMode, exc: Exception) -> None:
    stage = Stage.RENAME if mode.renames else Stage.MARKER

    assert isinstance(classify(exc, stage=stage, baseline=ABSENT, fresh=ABSENT, mode=mode), Unknown)


def test_in_place_a_refused_marker_create_is_unknown_for_the_file_is_there() -> None:
    outcome = classify(OSError("Failure"), stage=Stage.MARKER, baseline=ABSENT, fresh=PRESENT,
                       mode=DeliveryMode.NO_RENAME)

    assert isinstance(outcome, Unknown)


def test_in_place_an_upload_cut_whose_partial_file_was_removed_is_not_delivered_and_one_left_is_unknown() -> None:
    removed = classify(EOFError(), stage=Stage.UPLOAD, baseline=ABSENT, fresh=ABSENT, mode=DeliveryMode.NO_RENAME)
    left = classify(EOFError(), stage=Stage.UPLOAD, baseline=ABSENT, fresh=PRESENT, mode=DeliveryMode.NO_RENAME)

    assert isinstance(removed, Failed) and isinstance(left, Unknown)


# -- the verdicts, per mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [DeliveryMode.NO_STAT, DeliveryMode.QUICK_INGEST])
def test_where_the_renames_answer_is_the_receipt_an_acknowledged_rename_proves_the_delivery(mode) -> None:
    found = verdict(mode, (EvidenceStage.RENAMED, renamed()), baseline=Listing.not_looked(NAME), listing=ABSENT)

    assert found.resolution is Resolution.COMPLETED and Proof.RENAME_ACKNOWLEDGED.value in found.summary


@pytest.mark.parametrize("mode", [DeliveryMode.STANDARD, DeliveryMode.NO_RENAME])
def test_where_a_look_is_the_receipt_an_acknowledged_rename_alone_proves_nothing(mode) -> None:
    assert verdict(mode, (EvidenceStage.RENAMED, renamed())).resolution is Resolution.OUTCOME_UNKNOWN


def test_an_acknowledged_rename_proves_nothing_without_its_marker_or_with_another_size() -> None:
    assert verdict(DeliveryMode.NO_STAT, (EvidenceStage.RENAMED, renamed(MARKED)),
                   expected=MARKED).resolution is Resolution.OUTCOME_UNKNOWN
    assert verdict(DeliveryMode.NO_STAT, (EvidenceStage.RENAMED, renamed(MARKED, marked=True)),
                   expected=MARKED).resolution is Resolution.COMPLETED
    assert verdict(DeliveryMode.NO_STAT, (EvidenceStage.RENAMED, renamed(size=1))).resolution \
        is Resolution.OUTCOME_UNKNOWN


def test_in_no_stat_nothing_but_an_acknowledged_rename_proves_and_the_summary_says_who_settles_it() -> None:
    found = verdict(DeliveryMode.NO_STAT, (EvidenceStage.INTERRUPTED, PRESENT), baseline=Listing.not_looked(NAME))

    assert found.resolution is Resolution.OUTCOME_UNKNOWN and "partner's word" in found.summary


def test_in_quick_ingest_a_name_gone_after_the_rename_is_no_proof_without_its_acknowledgment() -> None:
    assert verdict(DeliveryMode.QUICK_INGEST, (EvidenceStage.INTERRUPTED, ABSENT),
                   listing=ABSENT).resolution is Resolution.OUTCOME_UNKNOWN


def test_in_place_a_file_without_its_marker_never_counts_as_delivered() -> None:
    partial = Listing(final_name=NAME, present=True, size=len(DATA) - 5, mtime=1)
    whole_unmarked = Listing(final_name=NAME, present=True, size=len(DATA), mtime=1)
    whole_marked = Listing(final_name=NAME, present=True, size=len(DATA), mtime=1, marker=MARKED.marker_sha256_hex)

    for listing in (partial, whole_unmarked):
        assert verdict(DeliveryMode.NO_RENAME, listing=listing, expected=MARKED).resolution \
            is Resolution.OUTCOME_UNKNOWN
    assert verdict(DeliveryMode.NO_RENAME, listing=whole_marked, expected=MARKED).resolution is Resolution.COMPLETED


# -- evidence -------------------------------------------------------------------------------------------


def test_a_baseline_not_looked_at_round_trips_and_older_records_read_as_looked_at() -> None:
    blind = Evidence(EvidenceStage.BASELINE, Listing.not_looked(NAME), ATTEMPT)
    looked = Evidence(EvidenceStage.BASELINE, ABSENT, ATTEMPT)

    assert Evidence.from_detail(blind.to_detail()).listing.observed is False
    assert '"observed"' not in looked.to_detail()   # a listing serialises as it always did
    assert Evidence.from_detail(looked.to_detail()).listing.observed is True


def test_a_receipt_of_an_acknowledged_rename_is_read_back_as_a_renamed_observation() -> None:
    receipt = Receipt(Proof.RENAME_ACKNOWLEDGED, False, Evidence(EvidenceStage.RENAMED, renamed(), ATTEMPT))
    outcome = '{"attempt_id":"att-1","outcome":"Completed","receipt":' + receipt.to_detail() + ',"stage":"outcome"}'

    parsed = parse_evidence([outcome])

    assert parsed.observations == ((EvidenceStage.RENAMED.value, renamed()),)
