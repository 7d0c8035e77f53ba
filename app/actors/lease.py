"""The lease keeper: renews one attempt's lease from the confirmed claim through its last write.

- Renewals run on an APScheduler 3 ``BackgroundScheduler`` shared by the worker process, every
  ``renew_seconds``, each extending the lease to ``lease_seconds`` from the database's clock.
- The keepers of a process share a small pool of their own, so a renewal never waits behind the
  runner's statements, and one lock per keeper serializes its scheduled renewals with on-demand ones
  (``renew_now``, before the retry at cutoff 2).
- A renewal that raises is retried at the next interval and stops nothing: a network blip must not
  abort a healthy build. The pool replaces a dead connection before it hands it out.
- A renewal that changes no row means a takeover committed (or the attempt ended): the keeper sets
  the stop signal with ``LEASE_LOST``. Before cutoff 2 that stops preparation; during the upload the
  runner ignores it, and recovery reconciles.
- ``ending()`` comes just before the attempt's own last write (terminal, or a deferral back to Queued),
  and ``finish()`` right after it: from ``ending()`` on, a renewal that finds no row may have been ended
  by that write (a renewal blocked behind it finds the row ended the moment it commits), so it is not
  reported as lost ownership; the write's own answer says whether a takeover got there first.
  ``finish()`` stops renewals and waits for one in flight.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from uuid import UUID

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from app import logs, metrics
from app.actors.stop import StopReason, StopSignal
from app.store import export
from app.store.database import Database
from app.store.types import RenewResult, Role

log = logs.get(__name__)

#: How many times ``renew_now`` tries a renewal that raises before it gives up.
RENEW_NOW_TRIES = 3
#: Seconds before the second try of ``renew_now``; doubled for each later one.
RENEW_NOW_BACKOFF_SECONDS = 0.2
#: Threads the shared scheduler runs renewals on; a renewal is short, so a few cover many attempts.
SCHEDULER_THREADS = 16
#: The application_name of the keepers' connections, so an operator (or a test) can find them.
APPLICATION_NAME = "exports-lease"
#: Connections the renewals of one worker process share.
POOL_SIZE = 4


@dataclass(frozen=True)
class Renewal:
    """One renewal, for logs and tests: ``kind`` is "scheduled" or "on-demand"."""

    kind: str
    result: RenewResult
    started: float
    ended: float


class LeaseKeeper:
    """Keeps one attempt's lease renewed. Create through ``Leases.keep`` (which starts it)."""

    def __init__(
        self, *, db: Database, job_id: UUID, attempt_id: UUID, lease_seconds: float, renew_seconds: float,
        scheduler: BaseScheduler, stop: StopSignal,
    ) -> None:
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self._scheduler = scheduler
        self._stop = stop
        self._db = db
        self._lock = threading.Lock()            # one renewal of this attempt at a time
        self._finished = threading.Event()
        self._ending = threading.Event()
        self._job = None
        self.history: list[Renewal] = []
        #: Set by ``renew_now`` before it waits for the lock (tests confirm the wait with it).
        self.on_demand_waiting = threading.Event()
        self.lost = False
        #: The log fields bound where the attempt's keeper was made (its tenant, job, attempt and message).
        self._fields = {**logs.current(), "job_id": job_id, "attempt_id": attempt_id}

    # --- counts, for logs and tests ---------------------------------------------------------------

    @property
    def renewals(self) -> int:
        return sum(1 for r in self.history if r.result is RenewResult.RENEWED)

    @property
    def failures(self) -> int:
        return sum(1 for r in self.history if r.result is RenewResult.FAILED)

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._job = self._scheduler.add_job(
            self._scheduled, "interval", seconds=self.renew_seconds,
            id=f"lease:{self.job_id}:{self.attempt_id}", name="lease renewal",
            max_instances=1, coalesce=True, misfire_grace_time=None)

    def renew_now(self) -> RenewResult:
        """An on-demand renewal, serialized with the scheduled ones. Retries one that raises a few
        times with backoff; RENEWED only when a row changed."""
        result = RenewResult.FAILED
        for attempt in range(RENEW_NOW_TRIES):
            if attempt:
                time.sleep(RENEW_NOW_BACKOFF_SECONDS * 2 ** (attempt - 1))
            self.on_demand_waiting.set()
            with self._lock:
                self.on_demand_waiting.clear()
                result = self._renew("on-demand")
            if result is not RenewResult.FAILED:
                return result
        return result

    def ending(self) -> None:
        """The attempt's own last write is about to go out: a renewal that finds no row from here on is
        not a lost lease. Renewals go on until ``finish()``."""
        self._ending.set()

    def finish(self) -> None:
        """Stops renewals and waits for one in flight. Idempotent, never raises."""
        if self._finished.is_set():
            return
        self._finished.set()   # before waiting: a renewal in flight that finds no row now stays quiet
        if self._job is not None:
            try:
                self._job.remove()
            except JobLookupError:
                pass
            except Exception:   # the scheduler shut down first: nothing left to stop
                log.debug("lease.remove_failed", job_id=self.job_id, exc_info=True)
        with self._lock:   # waits for a renewal in flight
            pass

    # --- renewals ---------------------------------------------------------------------------------

    def _scheduled(self) -> None:
        # On a thread of the shared scheduler, which the attempt's binding does not reach: this
        # attempt's ids are bound here, for the renewal's lines and the store's.
        with self._lock, logs.bound(**self._fields):
            if self._finished.is_set():
                return
            self._renew("scheduled")

    def _renew(self, kind: str) -> RenewResult:
        """Holds ``self._lock``."""
        started = time.monotonic()
        try:
            with self._db.connection() as conn:
                result = export.renew_lease(conn, job_id=self.job_id, attempt_id=self.attempt_id,
                                            lease_seconds=self.lease_seconds)
        except Exception as exc:
            # Retried at the next interval; nothing stops. A dead connection is the pool's to replace.
            metrics.worker().renewals_failed.inc()
            log.warning("lease.renew_failed", job_id=self.job_id, attempt_id=self.attempt_id, error=type(exc).__name__)
            result = RenewResult.FAILED
        self.history.append(Renewal(kind, result, started, time.monotonic()))
        if result is RenewResult.LOST:
            if self._ending.is_set() or self._finished.is_set():
                # The attempt's last write is under way or behind it: no row is its answer, not a loss.
                return result
            self.lost = True
            metrics.worker().leases_lost.inc()
            log.warning("lease.lost", job_id=self.job_id, attempt_id=self.attempt_id)
            self._stop.set(StopReason.LEASE_LOST)
            self._cancel_schedule()
        return result

    def _cancel_schedule(self) -> None:
        if self._job is not None:
            try:
                self._job.remove()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"LeaseKeeper(job_id={self.job_id}, attempt_id={self.attempt_id}, renewals={self.renewals})"


@dataclass(frozen=True)
class Leases:
    """Makes started lease keepers for one database and one pair of timings. Their renewals share one
    small pool (a renewal holds a connection for one statement), not a connection per attempt: a
    thousand running attempts would otherwise need a thousand connections."""

    url: str
    lease_seconds: float
    renew_seconds: float
    scheduler: BaseScheduler = field(default_factory=lambda: shared_scheduler())
    pool_size: int = POOL_SIZE

    @cached_property
    def db(self) -> Database:
        return Database(self.url, Role.APP, min_size=1, max_size=self.pool_size, name=APPLICATION_NAME)

    def keep(self, job_id: UUID, attempt_id: UUID, stop: StopSignal) -> LeaseKeeper:
        keeper = LeaseKeeper(db=self.db, job_id=job_id, attempt_id=attempt_id,
                             lease_seconds=self.lease_seconds, renew_seconds=self.renew_seconds,
                             scheduler=self.scheduler, stop=stop)
        keeper.start()
        return keeper


_shared: BackgroundScheduler | None = None
_shared_lock = threading.Lock()


def new_scheduler() -> BackgroundScheduler:
    scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(SCHEDULER_THREADS)}, daemon=True)
    scheduler.start()
    return scheduler


def shared_scheduler() -> BackgroundScheduler:
    """The worker process's one scheduler for lease renewals, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.running:
            _shared = new_scheduler()
        return _shared
