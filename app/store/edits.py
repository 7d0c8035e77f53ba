"""An administrator's edits of a destination's credential reference and contract flags, one function per
statement in ``sql/edits.sql``; each writes only over what the editor read, with its event."""

from __future__ import annotations

from collections.abc import Mapping
from uuid import UUID

import psycopg

from app.store import connector

#: The partner's contract flags, as the destinations row names them.
CONTRACT_FLAGS = ("remote_hash", "acknowledgments", "name_and_size_identify", "read_back")


def set_credential(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, expected: str,
                   credential_ref: str, changed_by: str, reason: str | None = None) -> bool:
    """The reference becomes ``credential_ref`` only while it is still ``expected``; False when it was not
    (another edit committed first, or it is ``credential_ref`` already): nothing written."""
    return connector.fetch_one(conn, "edits_set_credential", dict(
        tenant_id=tenant_id, destination_id=destination_id, expected=expected, credential_ref=credential_ref,
        changed_by=changed_by, reason=reason)) is not None


def set_contract(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, was: Mapping[str, bool],
                 now: Mapping[str, bool], changed_by: str, reason: str | None = None) -> bool:
    """The four flags become ``now`` only while they are still ``was``; False otherwise, nothing written."""
    detail = ", ".join(f"{flag}: {was[flag]} -> {now[flag]}".lower() for flag in CONTRACT_FLAGS
                       if was[flag] != now[flag])
    return connector.fetch_one(conn, "edits_set_contract", dict(
        tenant_id=tenant_id, destination_id=destination_id, changed_by=changed_by, reason=reason,
        detail=detail, **{flag: now[flag] for flag in CONTRACT_FLAGS},
        **{f"was_{flag}": was[flag] for flag in CONTRACT_FLAGS})) is not None
