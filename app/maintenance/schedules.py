"""Schedules: each slot's export, created once, however many schedulers run and however often they restart.

APScheduler's cron trigger computes the fire times (``app.maintenance.cron``); the database decides
whether a slot ran. A pass reads the active schedules whose next fire time has come and, per schedule,
in one transaction: moves the schedule's next fire time on over the value it read (``schedule_advance``:
of two schedulers, the second waits on the row lock, then matches nothing and writes nothing), records
every slot it passed (``schedule_runs``' primary key: a slot recorded once, ever), and creates the export
of the slot it runs. A crash anywhere before the commit leaves the slot undecided for the next pass; after
it, decided for good. So a slot creates at most one export, and none is lost while a scheduler comes back
within the grace.

Which slot runs: the latest one due, if it is at most ``grace_seconds`` old when a scheduler gets to it;
the slots before it (several due at once, after every scheduler was down) are recorded Missed, folded into
it, and so is a slot older than the grace. An incremental schedule runs in order: while an earlier run of
it is live or OutcomeUnknown (and its delivery key has nothing Completed), the slot is recorded Held, and a
later pass creates its export once that run is settled (``release``); while one slot is held, later slots
are folded into it.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app import logs, metrics
from app.config import ConfigError, Settings
from app.delivery import naming
from app.maintenance.cron import Cron
from app.store import export, schedule
from app.store.database import Database
from app.store.errors import StoreError
from app.store.schedule import Decided, RunOutcome, RunTrigger
from app.store.types import ScheduleSlot

log = logs.get(__name__)

#: The creator a scheduled export records (the operator, for a run-now).
CREATED_BY = "scheduler"
#: Due schedules, and held slots, one pass reads.
DEFAULT_BATCH = 100
#: Slots one pass decides for one schedule at most; a schedule further behind catches up over several passes.
MAX_SLOTS_PER_PASS = 500


@dataclass(frozen=True)
class ScheduleConfig:
    #: A slot older than this when a scheduler gets to it is recorded Missed rather than run.
    grace_seconds: float
    batch_size: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if not self.grace_seconds > 0:
            raise ConfigError(f"grace_seconds must be positive, not {self.grace_seconds!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of at least 1, not {self.batch_size!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> ScheduleConfig:
        return cls(grace_seconds=settings.schedule_grace_seconds)


@dataclass(frozen=True)
class ScheduleCounts:
    due: int = 0
    created: int = 0
    missed: int = 0
    held: int = 0
    released: int = 0
    #: Another scheduler decided the schedule's slots first (or it was paused meanwhile): nothing written.
    raced: int = 0
    errors: int = 0


class Schedules:
    """Fires the due schedules and releases held slots. ``db`` runs as exports_app."""

    def __init__(self, db: Database, config: ScheduleConfig):
        self.db = db
        self.config = config

    def run_once(self, *, as_of: datetime | None = None) -> ScheduleCounts:
        """One pass; ``as_of`` replays a given instant instead of the database's clock (for tests)."""
        counts = dataclasses.asdict(ScheduleCounts())
        with self.db.connection() as conn:
            due = schedule.read_due(conn, limit=self.config.batch_size, as_of=as_of)
            held = schedule.read_held(conn, limit=self.config.batch_size)
        counts["due"] = len(due)
        for found in due:
            with logs.bound(schedule_id=found.id):
                self._guarded(counts, lambda found=found: self._fire(found, counts))
        for row in held:
            with logs.bound(schedule_id=row["schedule_id"]):
                self._guarded(counts, lambda row=row: self._release(row["tenant_id"], row["schedule_id"],
                                                                   row["slot"], counts))
        result = ScheduleCounts(**counts)
        if any(v for k, v in counts.items() if k != "due"):
            log.info("schedules.run", **{k: v for k, v in counts.items() if v})
        return result

    @staticmethod
    def _guarded(counts: dict[str, int], work) -> None:
        try:
            work()
        except Exception as exc:
            # Nothing of this schedule's pass committed: its slots stay undecided for the next pass, and
            # one that keeps failing becomes Missed once past the grace.
            counts["errors"] += 1
            log.warning("schedules.pass_failed", error=type(exc).__name__, detail=str(exc)[:200])

    def _fire(self, due: schedule.Due, counts: dict[str, int]) -> None:
        cron = Cron.parse(due.cron, due.time_zone)
        fires: dict[datetime, datetime] = {}   # slot -> its first fire: a second 02:00 is the same slot
        fire: datetime | None = due.next_fire_at
        while fire is not None and fire <= due.now and len(fires) < MAX_SLOTS_PER_PASS:
            fires.setdefault(cron.slot(fire), fire)
            fire = cron.after(fire)
        next_fire = fire
        slots = list(fires.items())
        last_slot, last_fire = slots[-1]
        caught_up = next_fire is None or next_fire > due.now
        run = caught_up and (due.now - last_fire).total_seconds() <= self.config.grace_seconds
        decided = [Decided(slot, at, RunOutcome.MISSED, detail=self._missed(due.now, at, last_slot))
                   for slot, at in (slots[:-1] if run else slots)]
        with self.db.connection() as conn, conn.transaction():
            if not schedule.advance(conn, schedule_id=due.id, seen=due.next_fire_at, next_fire_at=next_fire):
                counts["raced"] += 1
                return
            since = None
            if run:
                outcome, detail, since = self._decide(conn, due.id, due.incremental)
                job_id = uuid.uuid4() if outcome is RunOutcome.CREATED else None
                decided.append(Decided(last_slot, last_fire, outcome, job_id, detail))
            for recorded in schedule.record_runs(conn, schedule_id=due.id, trigger=RunTrigger.CRON, decided=decided):
                counts[recorded.outcome.value.lower()] += 1
                metrics.scheduler().schedule_slots.labels(recorded.outcome.value).inc()
                if recorded.job_id is not None:
                    create_slot_export(conn, tenant_id=due.tenant_id, destination_id=due.destination_id,
                                       job_id=recorded.job_id, created_by=CREATED_BY,
                                       slot=ScheduleSlot(due.id, recorded.slot, due.incremental, since))
                log.info("schedules.slot", slot=recorded.slot, outcome=recorded.outcome.value,
                         job_id=recorded.job_id, detail=recorded.detail)

    def _missed(self, now: datetime, fire: datetime, last_slot: datetime) -> str:
        age = (now - fire).total_seconds()
        if age > self.config.grace_seconds:
            return f"older than the grace ({age:.0f}s > {self.config.grace_seconds:g}s) when a scheduler got to it"
        return f"folded into the later slot {last_slot:%Y-%m-%d %H:%M:%S}, due at the same time"

    @staticmethod
    def _decide(conn: psycopg.Connection, schedule_id: UUID,
                incremental: bool) -> tuple[RunOutcome, str | None, str | None]:
        """Whether the slot runs now, and for an incremental schedule the snapshot it sends the changes since."""
        if not incremental:
            return RunOutcome.CREATED, None, None
        hold = schedule.read_hold(conn, schedule_id=schedule_id)
        if hold.held_slot is not None:
            return RunOutcome.MISSED, f"folded into the held slot {hold.held_slot:%Y-%m-%d %H:%M:%S}", None
        if hold.holding_job_id is not None:
            return RunOutcome.HELD, f"waiting for export {hold.holding_job_id} to settle", None
        return RunOutcome.CREATED, None, hold.watermark

    def _release(self, tenant_id: UUID, schedule_id: UUID, slot: datetime, counts: dict[str, int]) -> None:
        with self.db.connection() as conn, conn.transaction():
            locked = schedule.lock(conn, tenant_id=tenant_id, schedule_id=schedule_id)
            if locked is None or locked.state is not schedule.ScheduleState.ACTIVE:
                return
            hold = schedule.read_hold(conn, schedule_id=schedule_id)
            if hold.holding_job_id is not None:
                return   # still waiting
            job_id = uuid.uuid4()
            if not schedule.release_held(conn, schedule_id=schedule_id, slot=slot, job_id=job_id,
                                         detail="released: the run it waited for was settled"):
                counts["raced"] += 1
                return
            create_slot_export(conn, tenant_id=tenant_id, destination_id=locked.destination_id, job_id=job_id,
                               created_by=CREATED_BY, slot=ScheduleSlot(schedule_id, slot, True, hold.watermark))
            counts["released"] += 1
            log.info("schedules.released", slot=slot, job_id=job_id)


def create_slot_export(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, job_id: UUID,
                       created_by: str, slot: ScheduleSlot) -> str:
    """The slot's export, in the caller's transaction (which recorded the slot); raises when it cannot be
    created, so the whole transaction, the slot's decision with it, rolls back."""
    result, file_name = naming.create_export(conn, job_id=job_id, tenant_id=tenant_id, destination_id=destination_id,
                                             delivery_key=uuid.uuid4().hex, created_by=created_by, slot=slot)
    if result is not export.CreateResult.CREATED or file_name is None:
        raise StoreError(f"the export of slot {slot.slot} was not created: {result.value}")
    return file_name


# --- run now -------------------------------------------------------------------------------------


class RunNowReply(enum.Enum):
    CREATED = "Created"
    #: No such schedule in the tenant, or it was removed.
    NOT_FOUND = "NotFound"
    #: Incremental: an earlier run is not settled, or a slot already waits for one; nothing recorded.
    HELD = "Held"
    #: A slot of the same instant was recorded first (two run-nows in one microsecond); nothing created.
    SLOT_TAKEN = "SlotTaken"


@dataclass(frozen=True)
class RunNow:
    reply: RunNowReply
    job_id: UUID | None = None
    slot: datetime | None = None
    file_name: str | None = None
    holding_job_id: UUID | None = None
    held_slot: datetime | None = None


def run_now(conn: psycopg.Connection, *, tenant_id: UUID, schedule_id: UUID, requested_by: str) -> RunNow:
    """An export for the schedule now, outside its cron (``exports schedule run-now``), of an active or
    paused schedule: a slot of its own (the local time now, trigger RunNow), created like a cron slot's,
    under the schedule's row lock. An incremental schedule's run waits its turn like any other: while an
    earlier run is not settled it is refused, with nothing recorded."""
    with conn.transaction() as tx:
        locked = schedule.lock(conn, tenant_id=tenant_id, schedule_id=schedule_id)
        if locked is None:
            return RunNow(RunNowReply.NOT_FOUND)
        since = None
        if locked.incremental:
            hold = schedule.read_hold(conn, schedule_id=schedule_id)
            if hold.holding_job_id is not None or hold.held_slot is not None:
                return RunNow(RunNowReply.HELD, holding_job_id=hold.holding_job_id, held_slot=hold.held_slot)
            since = hold.watermark
        slot = Cron.parse(locked.cron, locked.time_zone).slot(locked.now)
        job_id = uuid.uuid4()
        recorded = schedule.record_runs(conn, schedule_id=schedule_id, trigger=RunTrigger.RUN_NOW, decided=[
            Decided(slot, locked.now, RunOutcome.CREATED, job_id, f"run now by {requested_by}")])
        if not recorded:
            raise psycopg.Rollback(tx)
        file_name = create_slot_export(conn, tenant_id=tenant_id, destination_id=locked.destination_id,
                                       job_id=job_id, created_by=requested_by,
                                       slot=ScheduleSlot(schedule_id, slot, locked.incremental, since))
        metrics.scheduler().schedule_slots.labels(RunOutcome.CREATED.value).inc()
        return RunNow(RunNowReply.CREATED, job_id, slot, file_name)
    return RunNow(RunNowReply.SLOT_TAKEN)
