"""What ``exports destination pause|drain|resume`` do (``destinations`` registers them with its handlers):
hold a destination's queued exports, and let them go again.

A pause holds them at once (attempts already running are never stopped); a drain holds them while the
running attempts finish, then the destination is paused; a resume wakes every export the pause held. The
exports are never canceled, failed or deferred: the worker leaves them Queued, unclaimed. Like the other
destination commands these are for administrators; no operator grant is checked, and ``--by`` is recorded.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from app.cli import lookup as cli_lookup
from app.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    Context,
    Exit,
    Parser,
    bad_input,
    command,
    name,
    not_found,
    operator_name,
    positive_int,
    refused,
    text,
)
from app.cli.output import emit
from app.store import pausing
from app.store.views import Destination, Tenant

#: Seconds between two looks while ``drain --wait`` waits for the running attempts to end.
DRAIN_POLL_SECONDS = 0.5
#: Longest ``drain --wait``, in seconds.
MAX_DRAIN_WAIT = 86_400


def add(destination: argparse._SubParsersAction) -> dict[str, Parser]:
    """The three commands' parsers, by name, for ``destinations`` to give its handlers."""
    p = command(destination, "pause", help_="hold a destination's queued exports until it is resumed",
                description="Pause the destination: from now no export of it starts an attempt; its queued exports "
                            "(and those created meanwhile: creating one still queues it) wait, unclaimed, neither "
                            "canceled nor failed, until `exports destination resume`. Attempts already running are "
                            "not stopped; use `destination drain` to wait for them. Pausing a draining destination "
                            "pauses it at once.", exits=(EXIT_NOT_FOUND,))
    add_naming(p)
    parsers = {"pause": p}

    p = command(destination, "drain", help_="let running exports finish, hold the rest, then pause",
                description="Drain the destination: no new attempt starts, the attempts running now finish, and once "
                            "the last one has ended the destination is paused (by this command when nothing runs, "
                            "else by the scheduler's next sweeper pass, or by --wait). Queued exports wait as for "
                            "a pause. Run it again to see whether it is paused yet.",
                exits=(EXIT_NOT_FOUND, Exit(EXIT_REFUSED, "refused: --wait ran out with attempts still running; "
                                                          "the destination stays draining (run drain again to wait "
                                                          "more)")))
    add_naming(p)
    p.add_argument("--wait", type=positive_int(MAX_DRAIN_WAIT), metavar="SECONDS",
                   help="wait up to SECONDS for the running attempts to end, then answer (exit 4 if they did not)")
    parsers["drain"] = p

    p = command(destination, "resume", help_="release a paused or draining destination's exports",
                description="Resume a paused or draining destination: its queued exports get a fresh wake-up in the "
                            "same statement and run as workers take them (those of a paused tenant keep waiting "
                            "for `exports tenant resume`).", exits=(EXIT_NOT_FOUND,))
    add_naming(p)
    parsers["resume"] = p
    return parsers


def add_naming(p: argparse.ArgumentParser, *, record: bool = True) -> None:
    """NAME or --destination, and --tenant; with ``record``, --by and --reason too."""
    p.add_argument("name", nargs="?", type=name, metavar="NAME", help="destination id or exact name")
    p.add_argument("--destination", type=name, help="the same as NAME, as the other destination commands take it")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    if not record:
        return
    p.add_argument("--by", type=name, help="who does it, for the record (default: this login's name)")
    p.add_argument("--reason", type=text(), help="why, for the record and `destination status`")


def named(ctx: Context, args: argparse.Namespace) -> tuple[Tenant, Destination]:
    if (args.name is None) == (args.destination is None):
        raise bad_input("name the destination once: NAME or --destination")
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    return tenant, cli_lookup.destination(views, tenant, args.name or args.destination)


def _pause_of(ctx: Context, tenant: Tenant, found: Destination) -> pausing.DestinationPause:
    with ctx.connection() as conn:
        pause = pausing.read_destination(conn, tenant_id=tenant.id, destination_id=found.id)
    if pause is None:
        raise not_found(f"no destination {found.id} in tenant {tenant.name!r}")
    return pause


def _data(found: Destination, pause: pausing.DestinationPause, changed: bool, **more: Any) -> dict[str, Any]:
    return {"destination_id": str(found.id), "name": found.name, "changed": changed,
            "state": pause.state.value if pause.state else "active", "paused_by": pause.paused_by,
            "reason": pause.paused_reason, "paused_at": pause.paused_at, "running": pause.running,
            "queued": pause.queued, "tenant_paused": pause.tenant_paused_at is not None, **more}


def pause(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found = named(ctx, args)
    with ctx.connection() as conn:
        changed = pausing.pause_destination(conn, tenant_id=tenant.id, destination_id=found.id,
                                            changed_by=operator_name(args.by), reason=args.reason)
    pause = _pause_of(ctx, tenant, found)
    if not changed:
        emit(ctx, f"destination {found.name!r} is paused already (by {pause.paused_by} since "
                  f"{pause.paused_at:%Y-%m-%d %H:%M:%S}); nothing changed", _data(found, pause, False))
        return EXIT_OK
    emit(ctx, f"destination {found.name!r} paused: {pause.queued} queued exports wait until "
              f"`exports destination resume`" + _running(pause), _data(found, pause, True))
    return EXIT_OK


def _running(pause: pausing.DestinationPause) -> str:
    return f"; {pause.running} attempts already running finish" if pause.running else ""


def drain(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found = named(ctx, args)
    with ctx.connection() as conn:
        changed = pausing.drain_destination(conn, tenant_id=tenant.id, destination_id=found.id,
                                            changed_by=operator_name(args.by), reason=args.reason)
        settled = bool(pausing.settle_drains(conn, tenant_id=tenant.id, destination_id=found.id))
        deadline = time.monotonic() + (args.wait or 0)
        while not settled and args.wait and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_SECONDS)
            settled = bool(pausing.settle_drains(conn, tenant_id=tenant.id, destination_id=found.id))
    pause = _pause_of(ctx, tenant, found)
    if pause.state is pausing.PauseState.PAUSED:
        how = "drained and paused" if changed or settled else "is paused already; nothing changed"
        emit(ctx, f"destination {found.name!r} {how}: nothing of it runs, {pause.queued} queued exports wait "
                  "until `exports destination resume`", _data(found, pause, changed or settled))
        return EXIT_OK
    message = (f"destination {found.name!r} draining: {pause.running} attempts still running finish, "
               f"{pause.queued} queued exports wait; it is paused once the last attempt ends")
    if args.wait:
        raise refused(f"{message} (still running after {args.wait} s)", **_data(found, pause, changed))
    emit(ctx, message, _data(found, pause, changed))
    return EXIT_OK


def resume(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found = named(ctx, args)
    with ctx.connection() as conn:
        resumed = pausing.resume_destination(conn, tenant_id=tenant.id, destination_id=found.id,
                                             changed_by=operator_name(args.by), reason=args.reason)
    pause = _pause_of(ctx, tenant, found)
    held = (f"; its tenant {tenant.name!r} is paused: they keep waiting for `exports tenant resume`"
            if pause.tenant_paused_at is not None else "")
    if not resumed.resumed:
        emit(ctx, f"destination {found.name!r} is not paused; nothing changed" + held,
             _data(found, pause, False, woken=0))
        return EXIT_OK
    emit(ctx, f"destination {found.name!r} resumed: {resumed.woken} queued exports woken" + held,
         _data(found, pause, True, woken=resumed.woken))
    return EXIT_OK
