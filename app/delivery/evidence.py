"""What a delivery observed at the destination, and how it is written to and read from the database.

A ``Listing`` is one look at a final name; an ``Evidence`` is a listing with when in the delivery it
was taken, appended by the runner (and by recovery) to the attempt's DeliveryEvidence events; a
``Receipt`` is the evidence behind Completed. Each type's parse sits beside its serialisation, so
the JSON the worker writes and the JSON recovery and reconciliation read cannot drift apart. The
format is compact JSON with sorted keys; rows already stored in it must keep parsing.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.store.types import ExpectedFile  # the expected file is the store's: what cutoff 2 records

#: The length of a sha256 digest, in bytes.
SHA256_BYTES = 32


class Proof(enum.Enum):
    """How a listing ties the file under a final name to an expected file, weakest first."""

    NONE = "none"
    #: Name and size fit and nothing contradicts them: weak, different exports can share a size.
    NAME_AND_SIZE = "name-and-size"
    #: The server acknowledged this attempt's rename of its whole, verified upload onto the final name
    #: (and of its marker): the receipt of the modes that cannot look, or whose partner takes the file at
    #: once (``DeliveryMode.rename_answer_is_receipt``). It proves this attempt published the file, and
    #: identifies nothing already there.
    RENAME_ACKNOWLEDGED = "rename-acknowledged"
    #: A sha256 of the remote file (server-side or read back) equals the expected one.
    CHECKSUM = "checksum"
    #: The partner's acknowledgment names the expected sha256.
    ACKNOWLEDGMENT = "acknowledgment"

    @property
    def strong(self) -> bool:
        """Evidence an overwrite, or an identification without a name-and-size contract, can use."""
        return self in (Proof.CHECKSUM, Proof.ACKNOWLEDGMENT)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Listing:
    """What the destination showed for one final name at one moment."""

    final_name: str
    present: bool
    size: int | None = None
    #: Modification time in whole seconds, as SFTP v3 reports it; used only to notice a change.
    mtime: int | None = None
    sha256: bytes | None = field(default=None, repr=False)
    #: Where the hash came from: "check-file-name" or "read-back".
    hash_source: str | None = None
    #: The acknowledgment file's content (lower-case sha256 hex), if the partner wrote one.
    ack: str | None = None
    observed_at: datetime = field(default_factory=_now, compare=False)
    #: The sha256 (hex) of our completion marker's content, where the profile writes one and it is there.
    marker: str | None = None
    #: False when the delivery mode allows no look (``DeliveryMode.NO_STAT``): nothing is known of the
    #: name, and ``present`` says nothing.
    observed: bool = True

    @classmethod
    def not_looked(cls, final_name: str) -> Listing:
        """The baseline of a mode that may not look (``DeliveryMode.NO_STAT``): nothing is known."""
        return cls(final_name=final_name, present=False, observed=False)

    @property
    def occupied(self) -> bool:
        """Something was published under this name: the file, or the partner's acknowledgment of one."""
        return self.present or self.ack is not None

    def same_as(self, other: Listing) -> bool:
        """True when nothing observable changed between two listings of the same name."""
        if self.present != other.present or self.ack != other.ack:
            return False
        if not self.present:
            return True
        if self.size != other.size or self.mtime != other.mtime:
            return False
        return self.sha256 is None or other.sha256 is None or self.sha256 == other.sha256

    def checksum_matches(self, expected: ExpectedFile) -> bool:
        return self.present and self.sha256 is not None and self.sha256 == expected.sha256

    def ack_matches(self, expected: ExpectedFile) -> bool:
        return self.ack is not None and self.ack == expected.sha256_hex

    def contradicts(self, expected: ExpectedFile) -> bool:
        """The file under the name is provably not the expected one (its size or hash differ)."""
        if not self.present:
            return False
        if self.size != expected.size:
            return True
        return self.sha256 is not None and self.sha256 != expected.sha256

    def proof_for(self, expected: ExpectedFile) -> Proof:
        """The strongest tie between this listing and an expected file.

        An acknowledgment outlives the file (a partner may move a processed file away), so it counts
        even when the file is absent. A differing acknowledgment is not a contradiction on its own:
        it may be a stale one for an earlier file.
        """
        if self.contradicts(expected):
            return Proof.NONE
        if self.checksum_matches(expected):
            return Proof.CHECKSUM
        if self.ack_matches(expected):
            return Proof.ACKNOWLEDGMENT
        if self.present and self.ack is None:
            return Proof.NAME_AND_SIZE
        return Proof.NONE

    def marker_matches(self, expected: ExpectedFile) -> bool:
        """The completion marker the expected file needs is there with its content; true when it needs none."""
        return expected.marker is None or self.marker == expected.marker_sha256_hex

    def matches(self, expected: ExpectedFile) -> bool:
        """Name and size at least, and nothing contradicts: the weakest acceptable tie."""
        return self.proof_for(expected) is not Proof.NONE

    def as_dict(self) -> dict[str, object]:
        return {
            "final_name": self.final_name,
            "present": self.present,
            "size": self.size,
            "mtime": self.mtime,
            "sha256": self.sha256.hex() if self.sha256 is not None else None,
            "hash_source": self.hash_source,
            "ack": self.ack,
            "observed_at": self.observed_at.isoformat(),
            # Only where there is one: a listing without a marker serialises as it always did.
            **({"marker": self.marker} if self.marker is not None else {}),
            **({} if self.observed else {"observed": False}),
        }

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Listing:
        """The listing ``as_dict`` wrote; raises ValueError for anything else, so a damaged or foreign
        record is never read as evidence with a wrong size or hash."""
        sha = _optional(payload, "sha256", str)
        digest = bytes.fromhex(sha) if sha else None
        if digest is not None and len(digest) != SHA256_BYTES:
            raise ValueError("evidence sha256 is not a sha256 digest")
        observed_at = _optional(payload, "observed_at", str)
        return cls(
            final_name=_required(payload, "final_name", str),
            present=_required(payload, "present", bool),
            size=_optional(payload, "size", int),
            mtime=_optional(payload, "mtime", int),
            sha256=digest,
            hash_source=_optional(payload, "hash_source", str),
            ack=_optional(payload, "ack", str),
            observed_at=datetime.fromisoformat(observed_at) if observed_at else _now(),
            marker=_optional(payload, "marker", str),
            observed=_optional(payload, "observed", bool) is not False,
        )


class EvidenceStage(enum.StrEnum):
    """When a listing was taken during a delivery."""

    BASELINE = "baseline"
    RECEIPT = "receipt"
    RENAME_REFUSED = "rename-refused"
    INTERRUPTED = "interrupted"
    INSPECTED = "inspected"
    #: Not a look: what the server's answers showed, a whole upload of ``size`` bytes renamed onto the
    #: final name (and the marker renamed, where ``marker`` is set). Taken in the modes whose receipt is
    #: the rename's answer.
    RENAMED = "renamed"


@dataclass(frozen=True)
class Evidence:
    """One observation of the destination, for the caller to append to the attempt's evidence."""

    stage: EvidenceStage
    listing: Listing
    attempt_id: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The listing's fields with the stage and attempt beside them, in one flat object."""
        payload: dict[str, object] = {"stage": self.stage.value, "attempt_id": self.attempt_id}
        payload.update(self.listing.as_dict())
        return payload

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Evidence:
        """The evidence ``as_dict`` wrote; raises ValueError for anything else (an unknown stage too)."""
        return cls(
            stage=EvidenceStage(_required(payload, "stage", str)),
            listing=Listing.from_dict(payload),
            attempt_id=_optional(payload, "attempt_id", str),
        )

    def to_detail(self) -> str:
        """Compact JSON for a text column; holds no secret (a listing never does)."""
        return _dumps(self.as_dict())

    @classmethod
    def from_detail(cls, detail: str) -> Evidence:
        """The evidence ``to_detail`` wrote; raises ValueError for anything else."""
        return cls.from_dict(_loads(detail))


@dataclass(frozen=True)
class Receipt:
    """What the destination confirmed after the rename: the evidence behind Completed."""

    proof: Proof
    overwrote: bool
    #: The listing taken after the rename (stage RECEIPT); it names the final name and its size.
    evidence: Evidence

    def as_dict(self) -> dict[str, object]:
        """The evidence's flat object with the proof and whether it overwrote added."""
        payload = self.evidence.as_dict()
        payload.update({"proof": self.proof.value, "overwrote": self.overwrote})
        return payload

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> Receipt:
        """The receipt ``as_dict`` wrote; raises ValueError for anything else."""
        return cls(
            proof=Proof(_required(payload, "proof", str)),
            overwrote=_required(payload, "overwrote", bool),
            evidence=Evidence.from_dict(payload),
        )

    def to_detail(self) -> str:
        return _dumps(self.as_dict())

    @classmethod
    def from_detail(cls, detail: str) -> Receipt:
        """The receipt ``to_detail`` wrote; raises ValueError for anything else."""
        return cls.from_dict(_loads(detail))


def _dumps(payload: Mapping[str, object]) -> str:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)


def _loads(detail: str) -> Mapping[str, Any]:
    if not isinstance(detail, str):
        raise ValueError("evidence detail is not text")
    payload = json.loads(detail)
    if not isinstance(payload, dict):
        raise ValueError("evidence detail is not a JSON object")
    return payload


def _required(payload: Mapping[str, Any], key: str, kind: type) -> Any:
    if key not in payload:
        raise ValueError(f"evidence lacks {key}")
    value = _optional(payload, key, kind)
    if value is None:
        raise ValueError(f"evidence {key} is null")
    return value


def _optional(payload: Mapping[str, Any], key: str, kind: type) -> Any:
    value = payload.get(key)
    # bool is an int to Python, never to this format: a size of true is not a size.
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ValueError(f"evidence {key} is not a {kind.__name__}")
    return value
