"""Recovery's and reconciliation's verdicts: what proves that an attempt delivered its expected file.

Pure functions over evidence the attempt appended (``parse_evidence`` reads what
``app.delivery.evidence`` serialised) and, for recovery, a fresh listing of the destination. Completed
only on evidence that matches the expected file; OutcomeUnknown otherwise; never Failed from an
absent file, because a paused worker can outlast any timeout.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.delivery.modes import DeliveryMode
from app.store.types import ExpectedFile, Status

#: The stage of the record the runner appends with the attempt's own outcome (and its receipt).
OUTCOME_STAGE = "outcome"

T = TypeVar("T")


@dataclass(frozen=True)
class AttemptEvidence:
    """The DeliveryEvidence an attempt appended (or recovery appended for it), parsed."""

    #: The listing taken before the upload, if one was recorded (the first, if several).
    baseline: Listing | None
    #: Every later listing: receipts, refused renames, interruptions, inspections, outcome receipts.
    observations: tuple[tuple[str, Listing], ...]
    #: The server refused this attempt's rename: a file already held the name, which name and size
    #: alone can never tie to this attempt.
    rename_refused: bool


def parse_evidence(details: Iterable[str | None]) -> AttemptEvidence:
    """Parses evidence details in the order they were appended: the destination's ``Evidence``
    records, and the runner's outcome records whose receipt is a ``Receipt``. A detail that is
    neither is not evidence of anything, and is skipped."""
    baseline: Listing | None = None
    observations: list[tuple[str, Listing]] = []
    rename_refused = False
    for detail in details:
        try:
            payload = json.loads(detail or "")
        except ValueError:
            continue
        if not isinstance(payload, dict):
            continue
        if payload.get("stage") == OUTCOME_STAGE:
            receipt = _parsed(Receipt.from_dict, payload.get("receipt"))
            if receipt is not None:
                observations.append((receipt.evidence.stage.value, receipt.evidence.listing))
            continue
        evidence = _parsed(Evidence.from_dict, payload)
        if evidence is None:
            continue
        if evidence.stage is EvidenceStage.BASELINE:
            baseline = baseline or evidence.listing
        else:
            rename_refused = rename_refused or evidence.stage is EvidenceStage.RENAME_REFUSED
            observations.append((evidence.stage.value, evidence.listing))
    return AttemptEvidence(baseline, tuple(observations), rename_refused)


def _parsed(parse: Callable[[Mapping[str, Any]], T], payload: object) -> T | None:
    if not isinstance(payload, dict):
        return None
    try:
        return parse(payload)
    except ValueError:
        return None


class Resolution(enum.Enum):
    """How recovery resolves an expired Delivering attempt, or reconciliation an OutcomeUnknown."""

    COMPLETED = Status.COMPLETED
    OUTCOME_UNKNOWN = Status.OUTCOME_UNKNOWN


@dataclass(frozen=True)
class DeliveryVerdict:
    resolution: Resolution
    summary: str


def proves_delivery(listing: Listing, expected: ExpectedFile, baseline: Listing, *, weak_allowed: bool) -> Proof:
    """The proof a listing gives that the expected file was published by this attempt, or NONE.

    It must show the expected name, its completion marker where the profile writes one (the marker is
    what a partner that ingests complete transfers waits for: without it nothing is delivered to them),
    have changed from the baseline, and match the expected file with
    nothing contradicting it (size, and hash where the partner exposes one). A checksum, or an
    acknowledgment newer than the baseline's, is enough; name and size alone only when the baseline
    was absent and no refused rename showed the name occupied (then a file there is this delivery,
    published by atomic rename, and no other).
    """
    if listing.final_name != expected.name or listing.same_as(baseline) or not listing.marker_matches(expected):
        return Proof.NONE
    proof = listing.proof_for(expected)
    if proof is Proof.ACKNOWLEDGMENT and listing.ack == baseline.ack:
        return Proof.NONE
    if proof is Proof.NAME_AND_SIZE and not (weak_allowed and not baseline.occupied):
        return Proof.NONE
    return proof


def acknowledged_rename(listing: Listing, expected: ExpectedFile) -> bool:
    """A ``RENAMED`` record of the expected file: the whole upload renamed onto its name, and its marker
    where the profile writes one."""
    return (listing.final_name == expected.name and listing.present and listing.size == expected.size
            and listing.marker_matches(expected))


def decide_delivery(expected: ExpectedFile | None, *, replacement: bool, evidence: AttemptEvidence,
                    listing: Listing | None, inspect_error: str | None,
                    mode: DeliveryMode = DeliveryMode.STANDARD) -> DeliveryVerdict:
    """Completed only on evidence that matches the expected file; OutcomeUnknown otherwise, never
    Failed. An original's name is unique to its delivery key, so without a recorded baseline it was
    absent. A replacement shares its original's name: without its own baseline, a file there may be
    the original's, so nothing can prove this attempt delivered.

    ``mode`` is the one cutoff 2 recorded. Where the rename's answer is the receipt (no-stat,
    quick-ingest), this attempt's acknowledged rename proves the delivery whatever a look shows now
    (the partner may have taken the file); in no-stat it is the only proof, since nothing may be looked at."""
    if expected is None:
        return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN, "no expected file recorded at cutoff 2")
    renamed = EvidenceStage.RENAMED.value
    if mode.rename_answer_is_receipt and any(
            stage == renamed and acknowledged_rename(observed, expected) for stage, observed in evidence.observations):
        return DeliveryVerdict(Resolution.COMPLETED, f"the server acknowledged this attempt's rename of the "
                                                     f"expected file ({Proof.RENAME_ACKNOWLEDGED.value})")
    if not mode.looks:
        return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN, f"mode {mode.value}: only this attempt's acknowledged "
                                                           "rename proves a delivery, and none is recorded; the "
                                                           "partner's word settles it")
    if replacement and evidence.baseline is None:
        return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN,
                               "replacement without a recorded baseline: a file under its name may be the original's")
    baseline = evidence.baseline or Listing(final_name=expected.name, present=False)
    # A rename's answer is not a look: where it is no receipt it proves nothing.
    candidates = [(stage, observed) for stage, observed in evidence.observations if stage != renamed]
    if listing is not None:
        candidates.append(("destination", listing))
    for source, observed in candidates:
        proof = proves_delivery(observed, expected, baseline, weak_allowed=not evidence.rename_refused)
        if proof is not Proof.NONE:
            return DeliveryVerdict(Resolution.COMPLETED, f"{source} shows the expected file ({proof.value})")
    if inspect_error is not None:
        seen = "destination inspection failed: " + inspect_error
    elif listing is None:
        seen = "destination not inspected"
    elif listing.present and not listing.marker_matches(expected):
        seen = f"destination shows {expected.name} but not its completion marker {expected.marker_name}"
    elif listing.present:
        seen = f"destination shows {expected.name} with size {listing.size}, not proven this attempt's"
    else:
        seen = f"destination shows no {expected.name}"
    return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN, f"no evidence matches the expected file; {seen}")


def expected_file(name: str | None, size: int | None, sha256: bytes | None, marker_name: str | None = None,
                  marker: bytes | None = None) -> ExpectedFile | None:
    """What cutoff 2 recorded, or None when it recorded nothing usable."""
    if name is None or size is None or sha256 is None or len(sha256) != 32 or (marker_name is None) != (marker is None):
        return None
    return ExpectedFile(name=name, size=size, sha256=bytes(sha256), marker_name=marker_name,
                        marker=None if marker is None else bytes(marker))
