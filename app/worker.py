"""The worker process: the module ``dramatiq app.worker`` loads (``exports worker`` runs it) in each worker
process Dramatiq starts.

Importing it is that process's entry point, and its one read of the settings: it configures the
process's logging (EXPORTS_LOG_FORMAT), builds the broker EXPORTS_BROKER_URL names with the worker's
middleware (deduplication, this process's services, Dramatiq's Prometheus middleware when
``exports worker`` configured its address), installs it as Dramatiq's global broker and declares the
export actor on it: Dramatiq's CLI imports the module and then consumes every queue declared on the
global broker. Nothing connects at import: the services start when the worker has booted. Its stop
signals become one drain with a deadline (``app/actors/draining.py``), however many arrive.

The services come resolved from ``exports worker``, which starts the embedded ones when none is
configured and hands them to its worker processes in their environment: EXPORTS_DATABASE_URL (the
application's login) and EXPORTS_BROKER_URL (the embedded Redis's socket, ``unix://...``), so a
worker process always runs on configured services and starts none. Run directly (``dramatiq
app.worker``) with neither set, each worker process starts (or joins) the embedded PostgreSQL when it
boots, and the embedded Redis on its broker's first connection.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from datetime import UTC, datetime
from uuid import UUID

import dramatiq

from app import logs, metrics
from app.actors import dedup, export
from app.actors.draining import Draining
from app.actors.lease import shared_scheduler
from app.actors.runner import ExportRunner, RunResult
from app.broker import build_broker
from app.config import Settings, configured_database
from app.delivery import openpgp
from app.heartbeat import Heartbeat
from app.maintenance.scavenger import Scavenger, ScavengerConfig

log = logs.get(__name__)


class WorkerProcess(dramatiq.Middleware):
    """What a worker process runs, from the settings it read: the export runner (one set of pools, stop
    watcher and lease scheduler for all its threads), built on first use; from the worker's boot to its
    shutdown, the process's heartbeat; and the scavenger of its host's work directory (files are built
    on worker hosts, so each host cleans its own).

    The scavenger runs on the lease scheduler (APScheduler), at most one run at a time; several worker
    processes on one host may scavenge the same directory, which is safe: each deletion is of a file
    no attempt can use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._runner: ExportRunner | None = None
        self._runner_lock = threading.Lock()
        self._heartbeat: Heartbeat | None = None

    def runner(self) -> ExportRunner:
        with self._runner_lock:
            if self._runner is None:
                self._runner, close = export.build_runner(self.settings, _database_url(self.settings))
                atexit.register(close)
            return self._runner

    def built_runner(self) -> ExportRunner | None:
        """The runner if it was built, without building it (at shutdown, nothing to stop otherwise)."""
        return self._runner

    def run(self, job_id: UUID) -> RunResult:
        return self.runner().run(job_id)

    def in_flight(self) -> int:
        runner = self._runner
        return 0 if runner is None else runner.in_flight()

    def after_worker_boot(self, broker, worker) -> None:
        metrics.announce_build()   # after Dramatiq's Prometheus middleware chose multiprocess storage
        db = self.runner().db
        self._heartbeat = Heartbeat(db, "worker", interval_seconds=self.settings.heartbeat_seconds).start()
        scavenger = Scavenger(db, ScavengerConfig.from_settings(self.settings))
        shared_scheduler().add_job(_scavenge, "interval", args=(scavenger,),
                                   seconds=self.settings.scavenge_interval_seconds, id="scavenger",
                                   max_instances=1, coalesce=True, misfire_grace_time=None,
                                   next_run_time=datetime.now(UTC), replace_existing=True)

    def before_worker_shutdown(self, broker, worker) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def after_worker_shutdown(self, broker, worker) -> None:
        # Dramatiq's worker processes end without running atexit: the gpg homes of this process (and the
        # agents that signing started in them) go here, with the process.
        openpgp.forget_keyrings()


def _database_url(settings: Settings) -> str:
    configured = configured_database(settings)
    if configured is not None:
        return configured.app
    # Run directly (not by `exports worker`) with no database configured.
    from app import embedded

    return embedded.start(settings).app


def _scavenge(scavenger: Scavenger) -> None:
    try:
        metrics.count_run("scavenger", scavenger.run_once())
    except Exception as exc:
        # The next interval tries again; one failed run (database unreachable) stops nothing.
        log.warning("scavenger.run_failed", error=type(exc).__name__)


def install(settings: Settings) -> dramatiq.Actor:
    """Builds this process's broker and services from ``settings``, installs the broker as Dramatiq's
    global one and returns the export actor declared on it."""
    settings.require_broker()   # a worker given a shared database must be given the shared broker
    logs.configure(settings.log_format, level=logging.DEBUG if settings.debug else logging.INFO)
    logs.route_uncaught()
    broker = build_broker(settings)
    services = WorkerProcess(settings)
    broker.add_middleware(export.BindMessage(), before=type(broker.middleware[0]))
    broker.add_middleware(dedup.for_broker(broker))
    broker.add_middleware(services)
    if "dramatiq_prom_host" in os.environ:   # set by `exports worker` from EXPORTS_WORKER_METRICS
        from dramatiq.middleware.prometheus import Prometheus

        broker.add_middleware(Prometheus())
    broker.add_middleware(export.StopPreparationOnShutdown(services.built_runner))
    broker.add_middleware(Draining(stop_seconds=settings.worker_stop_seconds, in_flight=services.in_flight))
    dramatiq.set_broker(broker)
    return export.declare(broker, services.run)


export_ready = install(Settings.from_env())
