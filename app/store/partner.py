"""Whether a partner can be reached: each destination's circuit and its session slots, one function per
statement in ``sql/partner.sql``. Nothing here touches a job; the runner decides from these answers
whether an attempt tries the partner now or defers (``export.defer``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store import connector


@dataclass(frozen=True)
class Circuit:
    """A destination's circuit as an attempt decides on it; times are the database's."""

    open: bool
    #: Seconds until the next probe is due (0 or less: it is due); None while closed.
    probe_in_seconds: float | None
    #: Another attempt holds the probe (its claim has not run out).
    probe_held: bool
    failures: int
    last_error: str | None

    @classmethod
    def closed(cls) -> Circuit:
        return cls(open=False, probe_in_seconds=None, probe_held=False, failures=0, last_error=None)

    @classmethod
    def from_row(cls, state: str | None, failures: int | None, last_error: str | None,
                 probe_in_seconds: object, probe_held: bool | None) -> Circuit:
        """The circuit a ``destination_circuits`` row describes; no row (a None state) is closed."""
        if state is None:
            return cls.closed()
        return cls(open=state == "open",
                   probe_in_seconds=None if probe_in_seconds is None else float(probe_in_seconds),  # type: ignore[arg-type]
                   probe_held=bool(probe_held), failures=failures or 0, last_error=last_error)


@dataclass(frozen=True)
class Failure:
    """What recording a connection failure did to the circuit."""

    #: This failure opened a closed circuit (an opening, for the metrics).
    opened: bool
    failures: int
    next_probe_at: datetime


def read_circuit(conn: psycopg.Connection, *, destination_id: UUID) -> Circuit:
    row = connector.fetch_one(conn, "partner_read_circuit", dict(destination_id=destination_id))
    if row is None:
        return Circuit.closed()
    return Circuit.from_row(row["state"], row["failures"], row["last_error"], row["probe_in_seconds"],
                            row["probe_held"])


def claim_probe(conn: psycopg.Connection, *, destination_id: UUID, attempt_id: UUID, probe_seconds: float) -> bool:
    """True when this attempt now holds the open circuit's probe for ``probe_seconds``."""
    return connector.execute(conn, "partner_claim_probe", dict(
        destination_id=destination_id, attempt_id=attempt_id, probe_seconds=probe_seconds)) == 1


def record_failure(conn: psycopg.Connection, *, destination_id: UUID, attempt_id: UUID, error: str,
                   base_seconds: float, max_seconds: float) -> Failure:
    row = connector.fetch_one(conn, "partner_record_failure", dict(
        destination_id=destination_id, attempt_id=attempt_id, error=error, base_seconds=base_seconds,
        max_seconds=max_seconds))
    assert row is not None   # an upsert always returns its row
    return Failure(opened=row["opened"], failures=row["failures"], next_probe_at=row["next_probe_at"])


def close_circuit(conn: psycopg.Connection, *, destination_id: UUID) -> bool:
    """True when an open circuit closed; False when it was closed already."""
    return connector.execute(conn, "partner_close_circuit", dict(destination_id=destination_id)) == 1


def try_slot(conn: psycopg.Connection, *, destination_id: UUID, slot: int) -> bool:
    """Takes session slot ``slot`` of the destination for this database session, without waiting."""
    row = connector.fetch_one(conn, "partner_try_slot", dict(destination_id=destination_id, slot=slot))
    return bool(row and row["taken"])


def release_slot(conn: psycopg.Connection, *, destination_id: UUID, slot: int) -> bool:
    """False when this session did not hold the slot."""
    row = connector.fetch_one(conn, "partner_release_slot", dict(destination_id=destination_id, slot=slot))
    return bool(row and row["released"])


@dataclass(frozen=True)
class DestinationStatus:
    """One destination as ``exports destination status`` shows it."""

    id: UUID
    tenant_name: str
    name: str
    host: str
    port: int
    active: bool
    max_sessions: int
    auto_retries: int
    state: str
    opened_at: datetime | None
    next_probe_at: datetime | None
    failures: int | None
    last_error: str | None
    updated_at: datetime | None
    #: Session slots held now, by every worker host.
    sessions_in_use: int
    #: Queued jobs waiting out a deferral.
    deferred_jobs: int
    #: ``paused`` or ``draining`` (None: active), who, why and since when; its tenant's pause.
    pause_state: str | None = None
    paused_by: str | None = None
    paused_reason: str | None = None
    paused_at: datetime | None = None
    tenant_paused_at: datetime | None = None
    tenant_paused_by: str | None = None
    #: Queued exports a pause holds (its own or its tenant's).
    held_jobs: int = 0
    #: The newest Failed export's recorded cause (code, cause class, detail) and when.
    last_failure: str | None = None
    last_failure_at: datetime | None = None

    @property
    def latest_error(self) -> str | None:
        """The newer of the circuit's last connection error and the newest failed export's cause."""
        if self.last_failure is None:
            return self.last_error
        if self.last_error is None or self.updated_at is None or (
                self.last_failure_at is not None and self.last_failure_at >= self.updated_at):
            return self.last_failure
        return self.last_error


def statuses(conn: psycopg.Connection, *, tenant_id: UUID | None = None) -> list[DestinationStatus]:
    rows = connector.fetch_all(conn, "partner_status", dict(tenant_id=tenant_id))
    return [DestinationStatus(**row) for row in rows]
