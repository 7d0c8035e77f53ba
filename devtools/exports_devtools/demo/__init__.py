"""``exports demo`` (what ``make demo`` runs): the whole system on this machine, through a scenario
you can follow on screen.

It starts the embedded services (PostgreSQL, Redis, the partner's SFTP server), a fresh database, a
tenant with generated contacts and destinations on the partner, then the relay, two workers and the
scheduler as real processes, with short leases so recovery shows within a minute. Every step is a
real ``exports`` command, printed before it runs. The scenes:

1. exports delivered;
2. one canceled while queued (the relay is paused, so its wake-up waits in the outbox);
3. one stopped while building (the contacts table is locked, so the build waits where a slow
   query would);
4. one refused as too late: canceled during delivery (the link to the partner is held), then
   delivered;
5. a terms edit, and a stale edit refused;
6. a worker killed with SIGKILL mid-build, and the scheduler's recovery handing the export to the
   other worker, which delivers it exactly once;

then the table of exports and the partner's directory. Everything is stopped at the end, unless
``--keep``: then it keeps running, and the environment for the operator scripts is printed
(``exports demo --stop`` stops it later).

The machinery is in ``harness``, the scenes in ``scenes``; this module is the entry.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from app import embedded
from app.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_REFUSED, CliError, Context
from exports_devtools.demo import scenes
from exports_devtools.demo.harness import STATE_FILE, Demo, DemoFailed, say
from exports_devtools.processes import alive, stop_pids


def run(ctx: Context, *, keep: bool = False) -> int:
    """``exports demo``: plays every scene; EXIT_FAILURE when one did not go as it should."""
    state_dir = ctx.settings.state_dir
    if _kept_processes(state_dir):
        raise CliError(EXIT_REFUSED, "a demo started with --keep is still running; stop it first with "
                                     "`exports demo --stop`")
    started = time.monotonic()
    demo = Demo(ctx, state_dir)
    failed = False
    try:
        demo.setup()
        for scene in scenes.SCENES:
            scene(demo)
        scenes.outcome(demo)
    except DemoFailed as exc:
        failed = True
        say(f"\nThe demo stopped: {exc}")
        say(f"Logs: {demo.log_dir}")
    except KeyboardInterrupt:
        failed = True
        say("\nInterrupted.")
    finally:
        if keep and not failed:
            demo.keep()
        else:
            demo.shutdown()
    say(f"\nDone in {time.monotonic() - started:.0f}s.")
    return EXIT_FAILURE if failed else EXIT_OK


def stop_kept(ctx: Context) -> int:
    """``exports demo --stop``: stops what a ``--keep`` demo left running, by the pids it recorded."""
    path = ctx.settings.state_dir / STATE_FILE
    if not path.exists():
        say("No kept demo to stop.")
        return EXIT_OK
    state = json.loads(path.read_text())
    signals = {}
    for name, process in _kept_processes(ctx.settings.state_dir).items():
        signals[process["pid"]] = process["signal"]
        say(f"  {name} (pid {process['pid']}) signaled")
    for pid in stop_pids(signals):
        say(f"  pid {pid} did not stop in time and was killed")
    redis_pid = state.get("redis_pid")
    if alive(redis_pid):
        os.kill(redis_pid, signal.SIGTERM)
        say(f"  Redis (pid {redis_pid}) signaled")
    if state.get("started_database") and embedded.stop_database(ctx.settings):
        say("  PostgreSQL stopped")
    path.unlink(missing_ok=True)
    return EXIT_OK


def _kept_processes(state_dir: Path) -> dict[str, dict[str, int]]:
    """The processes a --keep demo recorded that are still alive, by name."""
    path = state_dir / STATE_FILE
    if not path.exists():
        return {}
    recorded = json.loads(path.read_text()).get("processes", {})
    return {name: process for name, process in recorded.items() if alive(process["pid"])}
