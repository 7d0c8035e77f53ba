"""Pauses of destinations and tenants, one function per statement in ``sql/pausing.sql``.

A paused destination's or tenant's queued exports wait unclaimed; a resume wakes them in its own statement.
Every change records its ``directory_events`` row with it, and "matched nothing" is an answer, not an error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store import connector


class PauseState(enum.Enum):
    """What a destination's ``pause_state`` holds (None: active)."""

    DRAINING = "draining"
    PAUSED = "paused"


@dataclass(frozen=True)
class Resumed:
    #: False: it was not paused (nor draining); nothing was written.
    resumed: bool
    #: Queued exports given a fresh wake-up by the resume.
    woken: int


@dataclass(frozen=True)
class DestinationPause:
    """A destination's pause as the operator reads it, with its tenant's."""

    state: PauseState | None
    paused_by: str | None
    paused_reason: str | None
    paused_at: datetime | None
    tenant_paused_at: datetime | None
    tenant_paused_by: str | None
    #: Its attempts Running or Delivering now, and its exports waiting in Queued.
    running: int
    queued: int


@dataclass(frozen=True)
class TenantRow:
    id: UUID
    name: str
    created_at: datetime
    paused_by: str | None
    paused_reason: str | None
    paused_at: datetime | None
    destinations: int
    paused_destinations: int
    queued: int
    running: int


def pause_destination(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, changed_by: str,
                      reason: str | None) -> bool:
    """Active or draining -> paused; False when it was paused already (or is not the tenant's)."""
    return connector.fetch_one(conn, "pausing_pause_destination", dict(
        tenant_id=tenant_id, destination_id=destination_id, changed_by=changed_by, reason=reason)) is not None


def drain_destination(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, changed_by: str,
                      reason: str | None) -> bool:
    """Active -> draining; False when it was paused or draining already (or is not the tenant's)."""
    return connector.fetch_one(conn, "pausing_drain_destination", dict(
        tenant_id=tenant_id, destination_id=destination_id, changed_by=changed_by, reason=reason)) is not None


def settle_drains(conn: psycopg.Connection, *, tenant_id: UUID | None = None,
                  destination_id: UUID | None = None) -> list[UUID]:
    """Draining -> paused for the named destination (every one when none is named) whose attempts have all
    ended; answers the destinations paused now."""
    rows = connector.fetch_all(conn, "pausing_settle_drains",
                               dict(tenant_id=tenant_id, destination_id=destination_id))
    return [r["destination_id"] for r in rows]


def resume_destination(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, changed_by: str,
                       reason: str | None) -> Resumed:
    row = connector.fetch_one(conn, "pausing_resume_destination", dict(
        tenant_id=tenant_id, destination_id=destination_id, changed_by=changed_by, reason=reason))
    assert row is not None   # the statement's last SELECT always answers one row
    return Resumed(resumed=row["resumed"] == 1, woken=int(row["woken"]))


def pause_tenant(conn: psycopg.Connection, *, tenant_id: UUID, changed_by: str, reason: str | None) -> bool:
    """Active -> paused; False when it was paused already."""
    return connector.fetch_one(conn, "pausing_pause_tenant",
                               dict(tenant_id=tenant_id, changed_by=changed_by, reason=reason)) is not None


def resume_tenant(conn: psycopg.Connection, *, tenant_id: UUID, changed_by: str, reason: str | None) -> Resumed:
    row = connector.fetch_one(conn, "pausing_resume_tenant",
                              dict(tenant_id=tenant_id, changed_by=changed_by, reason=reason))
    assert row is not None
    return Resumed(resumed=row["resumed"] == 1, woken=int(row["woken"]))


def list_tenants(conn: psycopg.Connection, *, tenant_id: UUID | None = None) -> list[TenantRow]:
    """Every tenant, by name; only the one with ``tenant_id`` when it is given."""
    return [TenantRow(**row) for row in connector.fetch_all(conn, "pausing_list_tenants", dict(tenant_id=tenant_id))]


def read_destination(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID) -> DestinationPause | None:
    row = connector.fetch_one(conn, "pausing_read_destination",
                              dict(tenant_id=tenant_id, destination_id=destination_id))
    if row is None:
        return None
    state = row.pop("pause_state")
    return DestinationPause(state=None if state is None else PauseState(state), **row)
