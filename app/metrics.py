"""Prometheus metrics: what each process counts, and how it serves them.

- The relay and the scheduler serve ``/metrics`` themselves (``serve``), on loopback by default.
- A worker is several Dramatiq processes: Dramatiq's Prometheus middleware aggregates every process's
  metrics through ``PROMETHEUS_MULTIPROC_DIR`` and serves them from its own exposition process
  (``exports worker`` binds it to the configured address). prometheus_client picks its multiprocess
  storage when it is first imported, which the middleware does after it sets that directory: so nothing
  here imports prometheus_client before a metric is first used.
- The scheduler's gauges are read from the database on each scrape (``DatabaseGauges``). They describe
  the database, not the process: every scheduler serves the same values, so the alert rules
  (deploy/prometheus/exports-rules.yml) take their ``max`` across schedulers, never their sum, and a
  rule of their own says when no scheduler is scraped at all.
- Every process serves ``exports_build_info{version}`` (``announce_build``).

Every metric is listed, with the alerts built on them, in docs/operations.md; each name passes
``promtool check metrics`` (a test scrapes each process and runs it).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from app import logs

log = logs.get(__name__)

#: Seconds buckets for builds, uploads and stop latency: a small export takes milliseconds, a large one minutes.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, float("inf"))


def parse_address(address: str) -> tuple[str, int] | None:
    """``host:port`` to serve on, or None for ``off``. Raises ValueError naming what is wrong."""
    if address.strip().lower() == "off":
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"a metrics address is host:port or off, not {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


#: The prefix of an ``exports worker``'s multiprocess metrics directory under the state directory; its pid follows.
WORKER_METRICS_PREFIX = "worker-metrics-"


def worker_metrics_dir(state_dir: Path, pid: int) -> Path:
    """Where the worker processes of the ``exports worker`` of ``pid`` keep their metrics files."""
    return state_dir / f"{WORKER_METRICS_PREFIX}{pid}"


def remove_worker_metrics_dirs(state_dir: Path, *, keep: int) -> list[Path]:
    """Removes the metrics directories of the ``exports worker`` processes of this state directory that are
    gone (a SIGKILL or a crash leaves its own), keeping ``keep``'s (this process) and any whose pid runs;
    returns those removed. The state directory is one host's, so a pid names a process of this host."""
    removed = []
    for path in state_dir.glob(f"{WORKER_METRICS_PREFIX}*"):
        pid_text = path.name.removeprefix(WORKER_METRICS_PREFIX)
        if not pid_text.isdigit() or int(pid_text) == keep or not path.is_dir() or _running(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # EPERM: someone else's process, so running
        return True
    return True


def serve(address: str, *, extra: Any = None) -> int | None:
    """Serves this process's metrics, and ``extra``'s (a collector read on each scrape), on ``address``;
    returns the port (useful with port 0)."""
    parsed = parse_address(address)
    if parsed is None:
        return None
    import prometheus_client

    registry = prometheus_client.CollectorRegistry(auto_describe=True)
    registry.register(_Default(prometheus_client.REGISTRY, extra))
    server, _thread = prometheus_client.start_http_server(parsed[1], addr=parsed[0], registry=registry)
    port = server.server_address[1]
    log.info("metrics.serving", address=parsed[0], port=port)
    return port


class _Default:
    """The process's default registry and an extra collector, served together: the extra one lives only
    as long as the server, so a second run in one process never registers it twice."""

    def __init__(self, default: Any, extra: Any) -> None:
        self.default = default
        self.extra = extra

    def collect(self) -> Iterator[Any]:
        yield from self.default.collect()
        if self.extra is not None:
            yield from self.extra.collect()


class _Worker:
    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.claims = Counter("exports_claims_total", "Claims (cutoff 1) by result: won, lost, unknown.", ["result"])
        self.runs = Counter("exports_runs_total", "Runs of the export actor by how they ended.", ["outcome"])
        self.stops_obeyed = Counter("exports_stops_obeyed_total",
                                    "Stop requests that ended an attempt before cutoff 2.")
        self.stop_latency = Histogram("exports_stop_latency_seconds",
                                      "From the attempt's stop signal to its Stopped write.", buckets=SECONDS_BUCKETS)
        self.deliveries = Counter("exports_deliveries_total", "Deliveries past cutoff 2 by outcome.", ["outcome"])
        self.build_seconds = Histogram("exports_build_seconds", "Time to build an export file.",
                                       buckets=SECONDS_BUCKETS)
        self.build_bytes = Counter("exports_build_bytes_total", "Bytes of export files built.")
        self.upload_seconds = Histogram("exports_upload_seconds", "Time from cutoff 2 to the delivery's outcome.",
                                        buckets=SECONDS_BUCKETS)
        self.upload_bytes = Counter("exports_upload_bytes_total", "Bytes of export files delivered (Completed).")
        self.renewals_failed = Counter("exports_lease_renewals_failed_total", "Lease renewals that raised.")
        self.leases_lost = Counter("exports_leases_lost_total", "Renewals that found the attempt taken over.")
        self.deferrals = Counter("exports_deferrals_total",
                                 "Attempts deferred before cutoff 2, by reason: unreachable, circuit_open, "
                                 "session_limit.", ["reason"])
        self.circuit_openings = Counter("exports_circuit_openings_total",
                                        "Destination circuits a connection failure opened.")
        self.build_retries = Counter("exports_build_retries_total",
                                     "Builds tried again on a fresh connection after a transient database error.")


class _Relay:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.published = Counter("exports_relay_published_total", "Outbox rows enqueued and marked published.")
        self.broker_failures = Counter("exports_relay_broker_failures_total", "Enqueues the broker refused.")
        self.lag = Gauge("exports_relay_lag_seconds", "Age of the oldest row in the relay's last batch.")


class _Scheduler:
    def __init__(self) -> None:
        from prometheus_client import Counter

        self.counts = Counter("exports_maintenance_total", "What each maintenance run did, by service and count.",
                              ["service", "count"])
        self.automatic_retries = Counter("exports_automatic_retries_total",
                                         "Replacements the retry policy created for proven transient non-deliveries.")
        self.schedule_slots = Counter("exports_schedule_slots_total",
                                      "Schedule slots decided, by outcome: Created (its export created), Missed, "
                                      "Held (waiting for an earlier incremental run to settle).", ["outcome"])


class _Notifier:
    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.requests = Counter("exports_webhook_requests_total",
                                "Webhook requests made, by result: delivered (2xx) or failed.", ["result"])
        self.request_seconds = Histogram("exports_webhook_request_seconds", "Time a receiver took to answer.",
                                         buckets=SECONDS_BUCKETS)
        self.dead = Counter("exports_webhook_dead_total",
                            "Webhook deliveries given up past the horizon (dead, kept for a person).")


_built: dict[type, Any] = {}
_building = threading.Lock()


def _once(kind: type) -> Any:
    """The one instance of a process's metric family, built on first use. Under a lock: two threads using
    a metric for the first time at once would otherwise both build it, and the second registration of a
    name in the registry raises (the chaos soak found it, seed 8)."""
    built = _built.get(kind)
    if built is None:
        with _building:
            built = _built.get(kind)
            if built is None:
                built = _built[kind] = kind()
    return built


def worker() -> _Worker:
    return _once(_Worker)


def relay() -> _Relay:
    return _once(_Relay)


def scheduler() -> _Scheduler:
    return _once(_Scheduler)


def announce_build() -> None:
    """Sets ``exports_build_info{version}`` to 1 in this process. In a worker process, call it once
    Dramatiq's Prometheus middleware has chosen multiprocess storage (after the process booted): the worker
    processes' values are then served as one series (the largest, 1), not one per process."""
    _once(_Build)


class _Build:
    def __init__(self) -> None:
        from prometheus_client import Gauge

        from app import __version__

        info = Gauge("exports_build_info", "Always 1; the running release is its version label.", ["version"],
                     multiprocess_mode="max")
        info.labels(__version__).set(1)


def notifier() -> _Notifier:
    return _once(_Notifier)


def count_run(service: str, counts: Any) -> None:
    """Adds a maintenance run's counts dataclass to ``exports_maintenance_total``."""
    if is_dataclass(counts) and not isinstance(counts, type):
        for name, value in asdict(counts).items():
            if value:
                scheduler().counts.labels(service, name).inc(value)


class DatabaseGauges:
    """A collector that reads the scheduler's gauges from the database on each scrape; a scrape that
    cannot reach the database reports ``exports_database_up 0`` rather than failing."""

    def __init__(self, db: Any, *, silent_seconds: float, webhook_late_seconds: float = 900.0) -> None:
        self.db = db
        self.silent_seconds = silent_seconds
        self.webhook_late_seconds = webhook_late_seconds
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from app.store import metrics as reads
        from app.store.types import FailureCode, Status

        up = GaugeMetricFamily("exports_database_up", "1 when the scheduler's last scrape read the database.")
        try:
            with self._lock, self.db.connection() as conn:
                by_status = reads.jobs_by_status(conn)
                failed = reads.failed_by_code(conn)
                backlog = reads.backlog(conn)
                live = reads.live_processes(conn, silent_seconds=self.silent_seconds)
                scheduled = reads.schedules(conn)
                hooks = reads.webhooks(conn, late_seconds=self.webhook_late_seconds)
        except Exception as exc:
            log.warning("metrics.scrape_failed", error=type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        # Every status and every code, 0 when no job has it: a rule compares a series that always exists.
        jobs = GaugeMetricFamily("exports_jobs", "Export jobs by status.", labels=["status"])
        for status in Status:
            jobs.add_metric([status.value], by_status.get(status.value, 0))
        yield jobs
        failed_jobs = GaugeMetricFamily("exports_failed_jobs", "Failed export jobs by failure code.", labels=["code"])
        for code in FailureCode:
            failed_jobs.add_metric([code.value], failed.get(code.value, 0))
        yield failed_jobs
        for name, help_, value in (
            ("exports_outbox_unpublished", "Due outbox rows the relay has not published.", backlog.unpublished),
            ("exports_outbox_oldest_unpublished_seconds",
             "How long the oldest due, unpublished outbox row has been due.", backlog.oldest_unpublished_seconds),
            ("exports_outbox_scheduled", "Outbox rows not yet due (deferrals' wake-ups).", backlog.scheduled),
            ("exports_deferred_jobs", "Queued jobs waiting out a deferral's backoff.", backlog.deferred_jobs),
            ("exports_queued_oldest_wait_seconds", "Longest wait in Queued since the last wake-up.",
             backlog.oldest_queued_seconds),
            ("exports_expired_leases", "Running or Delivering attempts whose lease expired (recovery's work).",
             backlog.expired_leases),
            ("exports_outcome_unknown_jobs", "Jobs in OutcomeUnknown: they need evidence or a person.",
             backlog.outcome_unknown),
            ("exports_queued_max_sweeps", "How often the sweeper republished the most republished Queued job.",
             backlog.max_sweeps),
            ("exports_open_circuits", "Destinations whose circuit is open: their exports wait for a probe.",
             backlog.open_circuits),
            ("exports_held_jobs", "Queued jobs of a paused tenant or destination: they wait for a resume.",
             backlog.held_jobs),
            ("exports_schedules_active", "Active export schedules.", scheduled.active),
            ("exports_schedule_overdue_seconds", "How long the most overdue schedule's fire has waited for a "
             "scheduler (0: none due).", scheduled.overdue_seconds),
            ("exports_schedule_held_slots", "Slots of incremental schedules held until an earlier run is settled.",
             scheduled.held_slots),
            ("exports_webhook_pending", "Webhook events owed to receivers.", hooks.pending),
            ("exports_webhook_oldest_pending_seconds", "Since the outcome of the oldest webhook event still owed.",
             hooks.oldest_pending_seconds),
            ("exports_webhook_late_endpoints", "Endpoints owed an event for longer than EXPORTS_WEBHOOK_LATE_SECONDS.",
             hooks.late_endpoints),
            ("exports_webhook_dead", "Webhook deliveries given up past the horizon (dead), in all.", hooks.dead),
        ):
            family = GaugeMetricFamily(name, help_)
            family.add_metric([], value)
            yield family
        processes = GaugeMetricFamily("exports_live_processes", "Processes with a recent heartbeat.", labels=["role"])
        for role in ("relay", "scheduler", "worker", "notifier"):
            processes.add_metric([role], live.get(role, 0))
        yield processes
