"""What a new export's file name is rendered from: one function per statement in ``sql/naming.sql``.

Both run inside the transaction that creates the export (``app.delivery.naming.create_export``), so the
name it keeps with the delivery key was rendered from the profile that was current when it committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from app.store import connector, errors


@dataclass(frozen=True)
class Naming:
    """What a new export's file name is rendered from (``naming_read``)."""

    profile: dict[str, Any]
    profile_version: int
    tenant_name: str
    created_at: datetime


def read(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID) -> Naming | None:
    """The destination's current profile and what else a name is rendered from; None: not the tenant's."""
    row = connector.fetch_one(conn, "naming_read", dict(tenant_id=tenant_id, destination_id=destination_id))
    return None if row is None else Naming(**row)


def take_sequence(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID) -> int:
    row = connector.fetch_one(conn, "naming_take_sequence",
                              dict(tenant_id=tenant_id, destination_id=destination_id))
    if row is None:
        raise errors.StoreError("naming_take_sequence matched no destination the naming read had found")
    return int(row["file_sequence"])
