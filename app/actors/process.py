"""What each worker process runs beside its actor: its heartbeat, and the scavenger of its host's work
directory (files are built on worker hosts, so each host cleans its own).

Started when the Dramatiq worker process has booted, stopped when it shuts down. The scavenger runs on
the process's lease scheduler (APScheduler), at most one run at a time; several worker processes on one
host may scavenge the same directory, which is safe: each deletion is of a file no attempt can use.
"""

from __future__ import annotations

from datetime import UTC, datetime

import dramatiq

from app import logs, metrics
from app.actors.lease import shared_scheduler
from app.config import Settings
from app.heartbeat import Heartbeat
from app.maintenance.scavenger import Scavenger, ScavengerConfig

log = logs.get(__name__)


class ProcessServices(dramatiq.Middleware):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._heartbeat: Heartbeat | None = None

    def after_worker_boot(self, broker, worker) -> None:
        from app.actors.export import process_runner

        db = process_runner().db
        self._heartbeat = Heartbeat(db, "worker", interval_seconds=self.settings.heartbeat_seconds).start()
        scavenger = Scavenger(db, ScavengerConfig.from_settings(self.settings))
        shared_scheduler().add_job(_scavenge, "interval", args=(scavenger,),
                                   seconds=self.settings.scavenge_interval_seconds, id="scavenger",
                                   max_instances=1, coalesce=True, misfire_grace_time=None,
                                   next_run_time=datetime.now(UTC), replace_existing=True)

    def before_worker_shutdown(self, broker, worker) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()


def _scavenge(scavenger: Scavenger) -> None:
    try:
        metrics.count_run("scavenger", scavenger.run_once())
    except Exception as exc:
        # The next interval tries again; one failed run (database unreachable) stops nothing.
        log.warning("scavenger.run_failed", error=type(exc).__name__)
