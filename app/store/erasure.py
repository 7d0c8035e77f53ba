"""A contact's erasure (GDPR), one function per statement in ``sql/erasure.sql``: which contacts an address
names, where the tenant's files went, and the erasure itself, recorded without the address."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store import connector
from app.store.errors import StoreError


@dataclass(frozen=True)
class Found:
    contacts: int
    #: Whether any of them ever consented, and so may have been in a file.
    ever_consented: bool


@dataclass(frozen=True)
class Exposure:
    """One destination's exports that may have carried an address."""

    destination_id: UUID
    destination: str
    host: str
    delivered: int
    first_delivered: datetime | None
    last_delivered: datetime | None
    undetermined: int
    in_flight: int


@dataclass(frozen=True)
class Erased:
    erasure_id: int
    contacts_erased: int
    recorded_at: datetime


def find(conn: psycopg.Connection, *, tenant_id: UUID, email: str) -> Found:
    row = connector.fetch_one(conn, "erasure_find", dict(tenant_id=tenant_id, email=email))
    assert row is not None   # an aggregate without GROUP BY answers one row
    return Found(row["contacts"], row["ever_consented"])


def exposure(conn: psycopg.Connection, *, tenant_id: UUID) -> list[Exposure]:
    return [Exposure(**row) for row in connector.fetch_all(conn, "erasure_exposure", dict(tenant_id=tenant_id))]


def erase(conn: psycopg.Connection, *, tenant_id: UUID, email: str, erased_by: str,
          reason: str | None) -> Erased | None:
    """Deletes the tenant's contacts of ``email`` and records that it did (never the address), in one
    statement; None when no contact matched (nothing changed)."""
    rows = connector.fetch_all(conn, "erasure_erase", dict(tenant_id=tenant_id, email=email, erased_by=erased_by,
                                                            reason=reason))
    if len(rows) > 1:
        raise StoreError(f"erasure_erase recorded {len(rows)} erasures")
    return Erased(rows[0]["id"], rows[0]["contacts_erased"], rows[0]["recorded_at"]) if rows else None
