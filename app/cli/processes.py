"""The long-running processes behind ``exports relay``, ``exports scheduler`` and ``exports worker``.

Each resolves the database once (the embedded one when EXPORTS_DATABASE_URL is unset) and stops
cleanly on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading

from app.cli.common import EXIT_OK, Context

#: Worker defaults: a few processes, a few threads each; an export is mostly waiting on I/O.
DEFAULT_PROCESSES = max(1, min(os.cpu_count() or 1, 4))
DEFAULT_THREADS = 4
#: Milliseconds dramatiq waits for running exports at shutdown before abandoning them to recovery.
WORKER_SHUTDOWN_TIMEOUT_MS = 30_000
LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _resolved(ctx: Context):
    return dataclasses.replace(ctx.settings, database_url=ctx.database_url())


def relay(ctx: Context, args: argparse.Namespace) -> int:
    from app import relay as relay_module

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    settings = _resolved(ctx)
    relay_module.run_forever(settings, _stop_on_signals())
    return EXIT_OK


def scheduler(ctx: Context, args: argparse.Namespace) -> int:
    from app import scheduler as scheduler_module

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    settings = _resolved(ctx)
    scheduler_module.run_forever(settings, _stop_on_signals())
    return EXIT_OK


def worker(ctx: Context, args: argparse.Namespace) -> int:
    """Replaces this process with ``dramatiq app.actors.worker``, so signals reach dramatiq directly."""
    env = dict(os.environ, EXPORTS_DATABASE_URL=ctx.database_url())
    argv = [sys.executable, "-m", "dramatiq", "app.actors.worker", "--processes", str(args.processes),
            "--threads", str(args.threads), "--worker-shutdown-timeout", str(WORKER_SHUTDOWN_TIMEOUT_MS)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
    return EXIT_OK   # not reached


def demo(ctx: Context, args: argparse.Namespace) -> int:
    from app.devtools import demo as demo_module

    if args.stop:
        return demo_module.stop_kept(ctx)
    return demo_module.run(ctx, keep=args.keep)
