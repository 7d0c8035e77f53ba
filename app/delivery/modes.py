"""Delivery modes: how a file is published on a partner's server, one per server quirk, each with the
reason it exists, the one step of it that cannot be undone, and what it needs the server to allow.

A destination names its mode (``destinations.delivery_mode``; ``exports destination check`` recommends
one from what the server allows, ``--apply`` records it), and cutoff 2 records the mode an attempt
publishes in with the file, so recovery and reconciliation judge it by the rules it followed. The rules
of each, as the worker (``app.delivery.upload``, ``app.delivery.in_place``), the classifier, the
verdicts (``app.delivery.verdicts``) and the chaos checker follow them, are in ``docs/protocol.md``
("Delivery modes"). None ever overwrites a file it did not write: a mode that publishes by rename
needs a rename that refuses an existing target, and the one that does not rename needs an exclusive
create that refuses one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class DeliveryMode(enum.StrEnum):
    """How a delivery publishes its file; the value is what the database and the command line say."""

    #: Baseline look, upload under a temporary name, the no-overwrite rename, a confirming look.
    STANDARD = "standard"
    #: The server refuses stat and listing: the rename's own answer is the receipt.
    NO_STAT = "no-stat"
    #: The server refuses rename: upload in place under the final name by exclusive create, then the
    #: completion marker, by exclusive create, is what publishes it.
    NO_RENAME = "no-rename"
    #: The partner's ingestion takes a file the moment it appears: a final name gone after an
    #: acknowledged rename is a delivery.
    QUICK_INGEST = "quick-ingest"

    @classmethod
    def of(cls, value: str | None) -> DeliveryMode:
        """The mode a row records; an attempt authorized before modes existed was standard."""
        return cls.STANDARD if value is None else cls(value)

    @property
    def reason(self) -> str:
        """The server behaviour the mode is for, as an operator reads it."""
        return _REASONS[self]

    @property
    def irreversible_step(self) -> str:
        """The one step after which the partner may have the file."""
        return _IRREVERSIBLE[self]

    @property
    def needs(self) -> tuple[str, ...]:
        """The ``destination check`` probes (``app.delivery.preflight.PROBES``) the mode relies on."""
        return _NEEDS[self]

    @property
    def looks(self) -> bool:
        """Whether the mode may stat the final name (a baseline, a confirmation, recovery's inspection)."""
        return self is not DeliveryMode.NO_STAT

    @property
    def renames(self) -> bool:
        """Whether the mode publishes by renaming a temporary file onto the final name."""
        return self is not DeliveryMode.NO_RENAME

    @property
    def rename_answer_is_receipt(self) -> bool:
        """Whether an acknowledged rename of the whole, verified upload proves the delivery on its own."""
        return self in (DeliveryMode.NO_STAT, DeliveryMode.QUICK_INGEST)

    @property
    def needs_marker(self) -> bool:
        """Whether the delivery profile must write a completion marker (it is what publishes the file)."""
        return self is DeliveryMode.NO_RENAME


_REASONS: Mapping[DeliveryMode, str] = {
    DeliveryMode.STANDARD: "the server allows stat and a rename that refuses an existing target",
    DeliveryMode.NO_STAT: "the server refuses stat and listing (nothing can be looked at before or after)",
    DeliveryMode.NO_RENAME: "the server refuses rename, or its rename replaces an existing file",
    DeliveryMode.QUICK_INGEST: "the partner's ingestion takes a file away as soon as it appears",
}
_IRREVERSIBLE: Mapping[DeliveryMode, str] = {
    DeliveryMode.STANDARD: "the no-overwrite rename of the file (then of its marker, where the profile writes one)",
    DeliveryMode.NO_STAT: "the no-overwrite rename of the file (then of its marker, where the profile writes one)",
    DeliveryMode.NO_RENAME: "the exclusive create of the completion marker",
    DeliveryMode.QUICK_INGEST: "the no-overwrite rename of the file (then of its marker, where the profile writes one)",
}
_NEEDS: Mapping[DeliveryMode, tuple[str, ...]] = {
    DeliveryMode.STANDARD: ("write", "stat", "rename", "rename_refuses_overwrite"),
    DeliveryMode.NO_STAT: ("write", "rename", "rename_refuses_overwrite"),
    DeliveryMode.NO_RENAME: ("write", "stat", "exclusive_create"),
    DeliveryMode.QUICK_INGEST: ("write", "stat", "rename", "rename_refuses_overwrite"),
}
