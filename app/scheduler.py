"""The scheduler process (``exports scheduler``): recovery (its takeovers and its reconciliation pass as
two jobs), the sweeper, the retry policy and the export schedules, each run by APScheduler at its interval,
with the process's heartbeat and its metrics (``/metrics``, with gauges read from the database on each scrape).

The services live in ``app/maintenance/``, one per file, each built from a database and its own
config with a ``run_once()`` that returns counts; this module only wires them in. Every write they
make is conditional, so any number of schedulers may run at once. (The scavenger runs in each worker
process instead, for the work directory of its own host: ``app/worker.py``.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler

from app import logs, metrics
from app.config import ConfigError, Settings
from app.heartbeat import SILENT_INTERVALS, Heartbeat
from app.maintenance.heartbeats import PRUNE_INTERVAL_SECONDS, HeartbeatPruner, PruneConfig
from app.maintenance.recovery import InspectDestination, Recovery, RecoveryConfig
from app.maintenance.retries import Retries, RetryConfig
from app.maintenance.schedules import ScheduleConfig, Schedules
from app.maintenance.sweeper import Sweeper, SweeperConfig
from app.store.database import Database
from app.store.types import Role

log = logs.get(__name__)


def _run_logged(name: str, service_run: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            metrics.count_run(name, service_run())
        except Exception as exc:
            # The next interval tries again; one failed run (database unreachable) stops nothing.
            log.warning("scheduler.run_failed", service=name, error=type(exc).__name__)

    return run


def build_scheduler(settings: Settings, db: Database, *, inspect_destination: InspectDestination | None = None,
                    blocking: bool = False) -> BaseScheduler:
    """The services at their intervals, each at most one run at a time (``max_instances=1``) with
    missed runs folded into one (``coalesce``). Not started."""
    if db.role is not Role.APP:
        raise ConfigError(f"the scheduler runs as {Role.APP.value}, not {db.role.value}")
    scheduler: BaseScheduler = (BlockingScheduler if blocking else BackgroundScheduler)(timezone="UTC")
    recovery = Recovery(db, RecoveryConfig.from_settings(settings), inspect_destination)
    services = (
        # Two jobs: a pass over many OutcomeUnknown jobs must not hold up the takeover of an expired lease
        # (the chaos soak, seed 1, saw leases wait 17 s behind one).
        ("recovery", recovery.take_over_once, settings.recovery_interval_seconds),
        ("reconciliation", recovery.reconcile_once, settings.recovery_interval_seconds),
        ("sweeper", Sweeper(db, SweeperConfig.from_settings(settings)).run_once, settings.sweep_interval_seconds),
        ("retries", Retries(db, RetryConfig.from_settings(settings)).run_once, settings.retry_interval_seconds),
        ("heartbeats", HeartbeatPruner(db, PruneConfig.from_settings(settings)).run_once, PRUNE_INTERVAL_SECONDS),
        ("schedules", Schedules(db, ScheduleConfig.from_settings(settings)).run_once,
         settings.schedule_interval_seconds),
    )
    for name, run, interval in services:
        scheduler.add_job(_run_logged(name, run), "interval", seconds=interval, id=name, name=name,
                          max_instances=1, coalesce=True, misfire_grace_time=None,
                          next_run_time=datetime.now(UTC))
    return scheduler


def run_forever(settings: Settings, url: str, stop_event: threading.Event) -> None:
    """The ``exports scheduler`` process on the database ``url`` (the application's login, resolved by
    its entry point): runs the services until ``stop_event`` is set, then waits for the runs in
    progress."""
    with Database(url, Role.APP, min_size=1, max_size=4, name="exports-scheduler") as db:
        beating = Heartbeat(db, "scheduler", interval_seconds=settings.heartbeat_seconds).start()
        _serve_metrics(settings, db)
        scheduler = build_scheduler(settings, db)
        scheduler.start()
        log.info("scheduler.started", recovery_every=settings.recovery_interval_seconds,
                 sweep_every=settings.sweep_interval_seconds, retries_every=settings.retry_interval_seconds,
                 schedules_every=settings.schedule_interval_seconds, schedule_grace=settings.schedule_grace_seconds)
        try:
            # In slices: a stop signal the kernel hands to one of APScheduler's threads does not interrupt
            # a lock wait here, and Python runs its handler only when this thread comes back to it.
            while not stop_event.wait(0.5):
                pass
        finally:
            scheduler.shutdown(wait=True)
            beating.stop()
            log.info("scheduler.stopped")


def _serve_metrics(settings: Settings, db: Database) -> None:
    gauges = metrics.DatabaseGauges(db, silent_seconds=SILENT_INTERVALS * settings.heartbeat_seconds,
                                    webhook_late_seconds=settings.webhook_late_seconds)
    metrics.announce_build()
    try:
        metrics.serve(settings.scheduler_metrics, extra=gauges)
    except OSError as exc:
        # Metrics are not worth stopping recovery for: say so, and run without them.
        log.error("metrics.unavailable", address=settings.scheduler_metrics, error=type(exc).__name__)
