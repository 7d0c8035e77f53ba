"""Schedules and their slots: one function per statement in ``sql/schedule.sql``.

Fire times are computed by the caller (APScheduler, ``app.maintenance.cron``); the database decides
whether a slot ran: ``schedule_runs``' primary key (schedule, slot), written in the transaction that
creates the slot's export. "Matched no row" is an answer, never an exception.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from app.store import connector, errors
from app.store.errors import Violation


class ScheduleState(enum.StrEnum):
    ACTIVE = "Active"
    PAUSED = "Paused"
    REMOVED = "Removed"


class RunOutcome(enum.StrEnum):
    """What a scheduler decided for a slot (``schedule_runs.outcome``)."""

    #: Its export was created in the same transaction.
    CREATED = "Created"
    #: Not run: older than the grace when a scheduler got to it, or folded into a later slot due with it.
    MISSED = "Missed"
    #: An incremental schedule's earlier run is not settled: created once it is.
    HELD = "Held"


class RunTrigger(enum.StrEnum):
    CRON = "Cron"
    RUN_NOW = "RunNow"


@dataclass(frozen=True)
class Due:
    """An active schedule whose next fire time has come, with the database's clock."""

    id: UUID
    tenant_id: UUID
    destination_id: UUID
    cron: str
    time_zone: str
    incremental: bool
    next_fire_at: datetime
    now: datetime


@dataclass(frozen=True)
class Locked:
    """A schedule's row, locked by this transaction."""

    id: UUID
    tenant_id: UUID
    destination_id: UUID
    cron: str
    time_zone: str
    incremental: bool
    state: ScheduleState
    now: datetime


@dataclass(frozen=True)
class Hold:
    """What an incremental schedule's next run waits for, and the changes it sends since."""

    #: The export holding it (a live or OutcomeUnknown one of a key with nothing Completed); None: nothing.
    holding_job_id: UUID | None
    #: A slot already Held, if any.
    held_slot: datetime | None
    #: The snapshot the last Completed run built from (pg_snapshot's text); None: no run completed yet.
    watermark: str | None


@dataclass(frozen=True)
class Decided:
    """One slot to record, as a scheduler decided it."""

    slot: datetime
    fire_at: datetime
    outcome: RunOutcome
    job_id: UUID | None = None
    detail: str | None = None


class AddResult(enum.Enum):
    ADDED = "Added"
    UNKNOWN_DESTINATION = "UnknownDestination"


def add(conn: psycopg.Connection, *, schedule_id: UUID, tenant_id: UUID, destination_id: UUID, cron: str,
        time_zone: str, incremental: bool, next_fire_at: datetime | None, changed_by: str) -> AddResult:
    try:
        with conn.transaction():
            connector.execute(conn, "schedule_add", dict(
                schedule_id=schedule_id, tenant_id=tenant_id, destination_id=destination_id, cron=cron,
                time_zone=time_zone, incremental=incremental, next_fire_at=next_fire_at, changed_by=changed_by))
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is Violation.UNKNOWN_DESTINATION:
            return AddResult.UNKNOWN_DESTINATION
        raise
    return AddResult.ADDED


def pause(conn: psycopg.Connection, *, tenant_id: UUID, schedule_id: UUID, changed_by: str) -> bool:
    return connector.execute(conn, "schedule_pause", dict(
        tenant_id=tenant_id, schedule_id=schedule_id, changed_by=changed_by)) == 1


def resume(conn: psycopg.Connection, *, tenant_id: UUID, schedule_id: UUID, next_fire_at: datetime | None,
           changed_by: str) -> bool:
    return connector.execute(conn, "schedule_resume", dict(
        tenant_id=tenant_id, schedule_id=schedule_id, next_fire_at=next_fire_at, changed_by=changed_by)) == 1


def remove(conn: psycopg.Connection, *, tenant_id: UUID, schedule_id: UUID, changed_by: str) -> bool:
    return connector.execute(conn, "schedule_remove", dict(
        tenant_id=tenant_id, schedule_id=schedule_id, changed_by=changed_by)) == 1


def read_due(conn: psycopg.Connection, *, limit: int, as_of: datetime | None = None) -> list[Due]:
    """Due now on the database's clock, or as of ``as_of``."""
    return [Due(**row) for row in connector.fetch_all(conn, "schedule_read_due", dict(limit=limit, as_of=as_of))]


def advance(conn: psycopg.Connection, *, schedule_id: UUID, seen: datetime, next_fire_at: datetime | None) -> bool:
    """Moves the schedule's next fire time on from ``seen``; False when another scheduler did first (or
    the schedule was paused or removed meanwhile). Locks the row until the transaction ends."""
    return connector.execute(conn, "schedule_advance", dict(
        schedule_id=schedule_id, seen=seen, next_fire_at=next_fire_at)) == 1


def lock(conn: psycopg.Connection, *, tenant_id: UUID, schedule_id: UUID) -> Locked | None:
    row = connector.fetch_one(conn, "schedule_lock", dict(tenant_id=tenant_id, schedule_id=schedule_id))
    return None if row is None else Locked(**{**row, "state": ScheduleState(row["state"])})


def read_hold(conn: psycopg.Connection, *, schedule_id: UUID) -> Hold:
    row = connector.fetch_one(conn, "schedule_read_hold", dict(schedule_id=schedule_id))
    assert row is not None   # scalar subqueries: always one row
    return Hold(**row)


def record_runs(conn: psycopg.Connection, *, schedule_id: UUID, trigger: RunTrigger,
                decided: Sequence[Decided]) -> list[Decided]:
    """Records each slot once; answers the ones this call recorded (a slot already recorded is skipped)."""
    if not decided:
        return []
    rows = connector.fetch_all(conn, "schedule_record_runs", dict(
        schedule_id=schedule_id, trigger=trigger.value, slots=[d.slot for d in decided],
        fire_ats=[d.fire_at for d in decided], outcomes=[d.outcome.value for d in decided],
        job_ids=[d.job_id for d in decided], details=[d.detail for d in decided]))
    recorded = {row["slot"] for row in rows}
    return [d for d in decided if d.slot in recorded]


def read_held(conn: psycopg.Connection, *, limit: int) -> list[dict[str, Any]]:
    return connector.fetch_all(conn, "schedule_read_held", dict(limit=limit))


def release_held(conn: psycopg.Connection, *, schedule_id: UUID, slot: datetime, job_id: UUID, detail: str) -> bool:
    return connector.execute(conn, "schedule_release_held", dict(
        schedule_id=schedule_id, slot=slot, job_id=job_id, detail=detail)) == 1
