"""``exports schedule``: exports on a cron schedule (add, list, show, pause, resume, remove, run-now).

The scheduler process fires the schedules (``app.maintenance.schedules``); these commands only write a
schedule's row through its conditional statements (``app.store.schedule``) and read what it did.
"""

from __future__ import annotations

import argparse
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import assert_never

from app.cli import lookup as cli_lookup
from app.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    Context,
    Parser,
    bad_input,
    command,
    group,
    name,
    not_found,
    positive_int,
    printable,
    refused,
    text,
    uuid_arg,
)
from app.cli.output import emit, table
from app.maintenance.cron import Cron, CronError
from app.maintenance.schedules import RunNowReply, run_now
from app.store import schedule
from app.store.views import Schedule, Tenant

#: Fire times ``add`` and ``show`` print ahead.
UPCOMING = 3


def register(commands: argparse._SubParsersAction) -> None:
    actions = group(commands, "schedule", "exports on a cron schedule: add, list, show, pause, resume, remove, run-now")

    p = command(actions, "add", help_="export a tenant's contacts to a destination on a cron schedule",
                description="Add a schedule: the scheduler creates one export per fire time of the cron expression "
                            "(five fields, minute hour day month day-of-week, or six with seconds first; days of "
                            "the week by name) in the time zone, DST as APScheduler computes it. With --incremental "
                            "each run sends the contacts changed since the last run that completed, withdrawn "
                            "consent marked for deletion; the first sends them all.",
                exits=(EXIT_NOT_FOUND, EXIT_REFUSED))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")
    p.add_argument("--cron", required=True, type=text(200), help='e.g. "0 2 * * *" (02:00 every day)')
    p.add_argument("--timezone", required=True, type=text(100), help="an IANA time zone, e.g. Europe/Berlin")
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.add_argument("--incremental", action="store_true", help="send only what changed since the last completed run")
    p.add_argument("--starting", type=text(64), default=None,
                   help="the first fire time considered: an ISO 8601 time (local to --timezone without an offset); "
                        "default now. At most the grace (EXPORTS_SCHEDULE_GRACE_SECONDS) in the past")
    p.set_defaults(handler=add)

    p = command(actions, "list", help_="list schedules", description="List schedules, newest first.",
                exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", type=name, help="tenant id or exact name")
    p.add_argument("--limit", type=positive_int(100_000), default=100)
    p.set_defaults(handler=list_schedules)

    p = _schedule_command(actions, "show", "one schedule: its next fire times, whether its next run is held, and "
                          "its recent runs with their exports' outcomes", exits=())
    p.add_argument("--runs", type=positive_int(10_000), default=20, help="recent runs to list (default 20)")
    p.set_defaults(handler=show)

    for verb, what in (("pause", "stop firing until resumed; exports it created go on"),
                       ("resume", "fire again from the next fire time after now (a pause's slots are not caught up)"),
                       ("remove", "stop firing for good; exports it created go on, and its history stays")):
        p = _schedule_command(actions, verb, what, exits=(EXIT_REFUSED,))
        p.add_argument("--by", required=True, type=name, help="the operator")
        p.set_defaults(handler=change, verb=verb)

    p = _schedule_command(actions, "run-now", "create the schedule's export now, in a slot of its own (an "
                          "incremental schedule's only once its last run is settled)", exits=(EXIT_REFUSED,))
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=fire_now)


def _schedule_command(actions: argparse._SubParsersAction, verb: str, help_: str,
                      exits: tuple[int, ...]) -> Parser:
    """A command about one schedule: its id, and the tenant it must belong to (so it can answer not found)."""
    p = command(actions, verb, help_=help_, description=help_[0].upper() + help_[1:] + ".",
                exits=(EXIT_NOT_FOUND, *exits))
    p.add_argument("schedule", type=uuid_arg, metavar="SCHEDULE", help="the schedule's id")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    return p


def _cron(expression: str, zone: str) -> Cron:
    try:
        return Cron.parse(expression, zone)
    except CronError as exc:
        raise bad_input(str(exc)) from None


def _starting(value: str | None, zone: Cron, grace_seconds: float) -> datetime:
    now = datetime.now(UTC)
    if value is None or value.lower() == "now":
        return now
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise bad_input(f"--starting is not an ISO 8601 time: {printable(value, 60)!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone.trigger.timezone)
    if when < now - timedelta(seconds=grace_seconds):
        raise bad_input(f"--starting is more than the grace ({grace_seconds:g}s) in the past: its slots would only "
                        "be recorded Missed")
    return when


def _fires(cron: Cron, fires: list[datetime]) -> list[str]:
    return [f"{cron.slot(f):%Y-%m-%d %H:%M:%S} {cron.time_zone} ({f.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC)"
            for f in fires]


def add(ctx: Context, args: argparse.Namespace) -> int:
    cron = _cron(args.cron, args.timezone)
    starting = _starting(args.starting, cron, ctx.settings.schedule_grace_seconds)
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    destination = cli_lookup.destination(views, tenant, args.destination)
    upcoming = cron.upcoming(starting, UPCOMING)
    schedule_id = uuid.uuid4()
    with ctx.connection() as conn:
        result = schedule.add(conn, schedule_id=schedule_id, tenant_id=tenant.id, destination_id=destination.id,
                              cron=cron.expression, time_zone=cron.time_zone, incremental=args.incremental,
                              next_fire_at=upcoming[0] if upcoming else None, changed_by=args.by)
    if result is schedule.AddResult.UNKNOWN_DESTINATION:
        raise not_found(f"no destination {destination.id} in tenant {tenant.name!r}")
    kind = "incremental " if args.incremental else ""
    lines = [f"{kind}schedule {schedule_id} added: {cron.expression!r} in {cron.time_zone} to {destination.name!r}",
             "  next fires: " + ("; ".join(_fires(cron, upcoming)) if upcoming else "never")]
    emit(ctx, "\n".join(lines), {"schedule_id": str(schedule_id), "tenant_id": str(tenant.id),
                                 "destination_id": str(destination.id), "cron": cron.expression,
                                 "time_zone": cron.time_zone, "incremental": args.incremental,
                                 "next_fires": upcoming})
    return EXIT_OK


def list_schedules(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant) if args.tenant else None
    found = views.schedules(tenant_id=tenant.id if tenant else None, limit=args.limit)
    rows = [[s.id, s.state, s.cron, s.time_zone, "incremental" if s.incremental else "full", s.next_fire_at,
             s.created_by] for s in found]
    emit(ctx, table(["schedule", "state", "cron", "zone", "kind", "next fire", "by"], rows) if rows
         else "(no schedules)", {"schedules": [dataclasses.asdict(s) for s in found]})
    return EXIT_OK


def show(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    found = cli_lookup.schedule(views, tenant, args.schedule)
    cron = Cron.parse(found.cron, found.time_zone)
    runs = views.schedule_runs(found.id, limit=args.runs)
    destination = views.destination(tenant.id, found.destination_id)
    upcoming = cron.upcoming(found.next_fire_at, UPCOMING) if found.next_fire_at else []
    held = _held(ctx, tenant, found) if found.incremental else None
    lines = [f"schedule {found.id}  {found.state}  {'incremental' if found.incremental else 'full'}",
             f"  tenant {tenant.name!r}  destination {destination.name if destination else None!r}  "
             f"cron {found.cron!r} in {found.time_zone}",
             f"  added by {found.created_by} {found.created_at:%Y-%m-%d %H:%M:%S}; last changed by {found.changed_by} "
             f"{found.changed_at:%Y-%m-%d %H:%M:%S}",
             "  next fires: " + ("; ".join(_fires(cron, upcoming)) if upcoming else "none")]
    if held:
        lines.append(f"  HELD: {held}")
    lines += ["", "recent runs:",
              table(["slot", "fired (UTC)", "trigger", "outcome", "export", "status", "detail"],
                    [[f"{r.slot:%Y-%m-%d %H:%M:%S}", f"{r.fire_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}", r.trigger,
                      r.outcome, r.job_id, _status(r.status, r.failure_reason), r.detail] for r in runs])
              if runs else "  (none)"]
    emit(ctx, "\n".join(lines), {"schedule": dataclasses.asdict(found), "next_fires": upcoming, "held": held,
                                 "runs": [dataclasses.asdict(r) for r in runs]})
    return EXIT_OK


def _status(status: str | None, failure_reason: str | None) -> str | None:
    return f"{status} ({failure_reason})" if failure_reason else status


def _held(ctx: Context, tenant: Tenant, found: Schedule) -> str | None:
    """Why an incremental schedule's next run waits, in words, or None when it does not."""
    with ctx.connection() as conn:
        hold = schedule.read_hold(conn, schedule_id=found.id)
    if hold.holding_job_id is None:
        return None
    job = ctx.views().job(tenant.id, hold.holding_job_id)
    status = job.status if job else "unknown"
    todo = ("reconcile it (exports reconcile) or replace it (exports replace)" if status == "OutcomeUnknown"
            else "it is still running")
    waiting = f"slot {hold.held_slot:%Y-%m-%d %H:%M:%S} waits" if hold.held_slot else "the next slot will wait"
    return f"{waiting} for export {hold.holding_job_id} ({status}) to settle: {todo}"


def change(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    found = cli_lookup.schedule(views, tenant, args.schedule)
    keys = dict(tenant_id=tenant.id, schedule_id=found.id, changed_by=args.by)
    with ctx.connection() as conn:
        if args.verb == "pause":
            changed, needs = schedule.pause(conn, **keys), "Active"
        elif args.verb == "resume":
            upcoming = Cron.parse(found.cron, found.time_zone).upcoming(datetime.now(UTC), 1)
            changed, needs = schedule.resume(conn, next_fire_at=upcoming[0] if upcoming else None, **keys), "Paused"
        else:
            changed, needs = schedule.remove(conn, **keys), "Active or Paused"
    if not changed:
        current = cli_lookup.schedule(views, tenant, found.id)
        raise refused(f"NotChanged: schedule {found.id} is {current.state}; {args.verb} needs it {needs}",
                      state=current.state)
    emit(ctx, f"schedule {found.id} {args.verb}d" if args.verb != "resume" else f"schedule {found.id} resumed",
         {"schedule_id": str(found.id), "action": args.verb})
    return EXIT_OK


def fire_now(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    found = cli_lookup.schedule(views, tenant, args.schedule)
    with ctx.connection() as conn:
        result = run_now(conn, tenant_id=tenant.id, schedule_id=found.id, requested_by=args.by)
    reply = result.reply
    if reply is RunNowReply.CREATED:
        emit(ctx, f"export {result.job_id} queued for schedule {found.id}, slot {result.slot:%Y-%m-%d %H:%M:%S} "
                  f"(file {result.file_name})",
             {"job_id": str(result.job_id), "schedule_id": str(found.id), "slot": result.slot,
              "final_name": result.file_name})
        return EXIT_OK
    if reply is RunNowReply.NOT_FOUND:
        raise refused(f"NotChanged: schedule {found.id} is {found.state}; only an active or paused one runs")
    if reply is RunNowReply.HELD:
        waits = f"export {result.holding_job_id}" if result.holding_job_id else \
            f"the held slot {result.held_slot:%Y-%m-%d %H:%M:%S}"
        raise refused(f"Held: schedule {found.id} is incremental and its runs take turns: {waits} must settle first; "
                      "nothing recorded", holding_job_id=str(result.holding_job_id) if result.holding_job_id else None)
    if reply is RunNowReply.SLOT_TAKEN:
        raise refused(f"SlotTaken: another run of schedule {found.id} took this instant; nothing created")
    assert_never(reply)
