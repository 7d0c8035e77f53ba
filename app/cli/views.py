"""Reads for operators (show, list, watch): their parsers and handlers. The rows come from
app/store/views.py, read-only."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any
from uuid import UUID

from app.cli import lookup as cli_lookup
from app.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    Context,
    bad_input,
    command,
    job_command,
    name,
    not_found,
    positive_int,
    printable,
    seconds_arg,
    status_arg,
    time_arg,
    uuid_arg,
)
from app.cli.output import emit, table
from app.store.types import Status
from app.store.views import AttemptEvent, JobSummary, Views

#: Status order for counts: the job's life, left to right.
STATUS_ORDER = [s.value for s in Status]
HEADERS = ["created", "export", "tenant", "destination", "status", "reason", "ver", "tries", "by", "schedule"]


def register(commands: argparse._SubParsersAction) -> None:
    p = job_command(commands, "show", "one export: row, attempt events, cancellation requests, evidence, outbox",
                    "Show one export: its row, attempt events, cancellation requests, delivery evidence and outbox.")
    p.set_defaults(handler=show)

    p = command(commands, "list",
                help_="list exports (by tenant, destination, schedule, status, time; a page at a time)",
                description="List exports, newest first, --limit at a time. A full page ends with the cursor of "
                            "the next: --after the last export listed (jobs created meanwhile never shift a page). "
                            "Times are ISO 8601, UTC without an offset; --since is inclusive, --until exclusive, "
                            "both on the export's creation.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", type=name, help="tenant id or exact name")
    p.add_argument("--destination", type=name, help="destination id or exact name (with --tenant)")
    p.add_argument("--schedule", type=uuid_arg, metavar="SCHEDULE", help="only the exports this schedule made "
                   "(with --tenant)")
    p.add_argument("--status", type=status_arg, help=f"one of: {', '.join(s.value for s in Status)}")
    p.add_argument("--since", type=time_arg, metavar="TIME", help="created at or after TIME")
    p.add_argument("--until", type=time_arg, metavar="TIME", help="created before TIME")
    p.add_argument("--after", type=uuid_arg, metavar="JOB", help="the next page: the exports listed after JOB")
    p.add_argument("--limit", type=positive_int(100_000), default=100, help="exports per page (default 100)")
    p.set_defaults(handler=list_jobs)

    p = command(commands, "watch", help_="live view of exports by state (Ctrl-C to stop)",
                description="A live view of exports by state, refreshing (Ctrl-C to stop).", exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", type=name, help="tenant id or exact name")
    p.add_argument("--interval", type=seconds_arg, default=1.0)
    p.add_argument("--limit", type=positive_int(1000), default=15)
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.set_defaults(handler=watch)


def show(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    job = cli_lookup.job(views, tenant, args.job)
    history = views.history(job)
    events, requests, outbox = history.events, history.cancellation_requests, history.outbox
    job_data = dataclasses.asdict(job)
    if job.expected_file_sha256 is not None:
        job_data["expected_file_sha256"] = bytes(job.expected_file_sha256).hex()
    data = {
        "job": job_data,
        "destination": history.destination_name,
        "events": [{**dataclasses.asdict(e), **_outcome_of(e)} for e in events],
        "cancellation_requests": [dataclasses.asdict(r) for r in requests],
        "evidence": [{"attempt_id": e.attempt_id, "observed_by": e.observed_by, "detail": e.detail,
                      "recorded_at": e.recorded_at} for e in events if e.kind == "DeliveryEvidence"],
        "outbox": [dataclasses.asdict(o) for o in outbox],
        "webhooks": [dataclasses.asdict(w) for w in history.webhooks],
        "held_by": history.held_by,
    }
    if ctx.json:
        emit(ctx, "", data)
        return EXIT_OK
    lines = [f"export {job.id}  {job.status}" + (f" ({job.failure_reason})" if job.failure_reason else ""),
             f"  tenant {tenant.name!r}  destination {data['destination']!r}  version {job.version}  "
             f"attempts {job.attempt_count}  created by {job.created_by}",
             f"  delivery key {job.delivery_key}"
             + (f"  replaces {job.replaces_job_id} ({job.replacement_reason})" if job.replaces_job_id else "")]
    if history.held_by:
        lines.append(f"  held: it waits for a resume of {history.held_by}")
    if job.schedule_id:
        since = ("changes since snapshot " + job.incremental_since if job.incremental_since
                 else "everything (its schedule's first run)") if job.incremental else "a full export"
        lines.append(f"  schedule {job.schedule_id}  slot {job.schedule_slot:%Y-%m-%d %H:%M:%S}  sends {since}")
    if job.expected_snapshot:
        lines.append(f"  built from snapshot {job.expected_snapshot} (the next incremental run's watermark once "
                     "Completed)")
    if job.attempt_id:
        # A finished job has no lease to speak of: only a live attempt's expiry means anything.
        lease = f"  lease until {job.lease_expires_at}" if job.lease_expires_at else ""
        lines.append(f"  attempt {job.attempt_id} by {job.claimed_by}{lease}")
    if job.expected_file_name:
        built_with = f"  built with profile v{job.expected_profile_version}" if job.expected_profile_version else ""
        built_with += f"  delivered in mode {job.expected_delivery_mode}" if job.expected_delivery_mode else ""
        lines.append(f"  expected file {job.expected_file_name}  {job.expected_file_bytes} bytes{built_with}")
    if job.deferrals:
        lines.append(f"  deferred {job.deferrals} times since {job.deferred_since:%Y-%m-%d %H:%M:%S}"
                     f" (partner unavailable), last: {printable(job.last_deferral or '', 200)}")
    lines += ["", "attempt events:",
              table(["time", "attempt", "kind", "by", "detail"],
                    [[e.recorded_at, str(e.attempt_id)[:8], e.kind, e.worker_id or e.observed_by, e.detail]
                     for e in events]) if events else "  (none)"]
    lines += ["", "cancellation requests:",
              table(["time", "request", "by", "outcome", "found", "attempt", "authorized at", "reason"],
                    [[r.recorded_at, str(r.id)[:8], r.requested_by, r.outcome, r.found_status,
                      str(r.found_attempt_id)[:8] if r.found_attempt_id else None, r.found_delivery_authorized_at,
                      r.reason] for r in requests]) if requests else "  (none)"]
    lines += ["", "outbox:",
              table(["created", "message", "published"],
                    [[o.created_at, o.message_id, o.published_at] for o in outbox]) if outbox else "  (none)"]
    if history.webhooks:
        lines += ["", "webhooks (exports webhook show has each one's attempts):",
                  table(["occurred", "event", "endpoint", "outcome", "state", "attempts", "finished"],
                        [[w.occurred_at, w.event_id, w.endpoint_name, w.status, w.state, w.attempts, w.finished_at]
                         for w in history.webhooks])]
    emit(ctx, "\n".join(lines), data)
    return EXIT_OK


def _outcome_of(event: AttemptEvent) -> dict[str, Any]:
    """A Finished event's outcome and failure code as fields: its detail starts with them
    (``Failed NotDelivered: ...``, ``Completed: proof=...``)."""
    if event.kind != "Finished" or not event.detail:
        return {}
    head = event.detail.split(":", 1)[0].split()
    return {"outcome": head[0] if head else None, "failure_reason": head[1] if len(head) > 1 else None}


def _rows(jobs: list[JobSummary]) -> list[list[Any]]:
    return [[j.created_at, j.id, j.tenant_name, j.destination_name, j.status, j.failure_reason or "", j.version,
             j.attempt_count, j.created_by, str(j.schedule_id)[:8] if j.schedule_id else ""] for j in jobs]


def list_jobs(ctx: Context, args: argparse.Namespace) -> int:
    if args.destination and not args.tenant:
        raise bad_input("--destination needs --tenant: a destination's name is its tenant's")
    if args.schedule and not args.tenant:
        raise bad_input("--schedule needs --tenant: a schedule is its tenant's")
    if args.since and args.until and args.since >= args.until:
        raise bad_input("--since must be before --until")
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant) if args.tenant else None
    destination = cli_lookup.destination(views, tenant, args.destination) if tenant and args.destination else None
    if tenant and args.schedule and views.schedule(tenant.id, args.schedule) is None:
        raise not_found(f"no schedule {args.schedule} in tenant {tenant.name!r}")
    after = None
    if args.after:
        after = views.job_position(args.after, tenant_id=tenant.id if tenant else None)
        if after is None:
            raise not_found(f"no export {args.after}" + (f" in tenant {tenant.name!r}" if tenant else ""))
    found = views.jobs(tenant_id=tenant.id if tenant else None, status=args.status, limit=args.limit,
                       destination_id=destination.id if destination else None, since=args.since, until=args.until,
                       after=after, schedule_id=args.schedule)
    data = [{"job_id": j.id, "tenant": j.tenant_name, "destination": j.destination_name, "status": j.status,
             "failure_reason": j.failure_reason, "version": j.version, "attempt_count": j.attempt_count,
             "created_by": j.created_by, "created_at": j.created_at, "schedule_id": j.schedule_id} for j in found]
    text = table(HEADERS, _rows(found)) if found else "no exports"
    if len(found) == args.limit:
        text += f"\n(a full page: the next one is --after {found[-1].id})"
    emit(ctx, text, data)
    return EXIT_OK


def render_watch(views: Views, tenant_id: UUID | None, limit: int) -> tuple[str, dict[str, Any]]:
    by_status = views.counts_by_status(tenant_id=tenant_id)
    recent = views.jobs(tenant_id=tenant_id, limit=limit)
    summary = "  ".join(f"{s}: {by_status.get(s, 0)}" for s in STATUS_ORDER)
    listing = table(HEADERS, _rows(recent)) if recent else "no exports"
    text = f"exports by state ({time.strftime('%H:%M:%S')})\n{summary}\n\n{listing}"
    return text, {"counts": {s: by_status.get(s, 0) for s in STATUS_ORDER},
                  "recent": [{"job_id": j.id, "status": j.status} for j in recent]}


def watch(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant) if args.tenant else None
    tenant_id = tenant.id if tenant else None
    if args.once:
        text, data = render_watch(views, tenant_id, args.limit)
        emit(ctx, text, data)
        return EXIT_OK
    try:
        while True:
            text, data = render_watch(views, tenant_id, args.limit)
            if ctx.json:
                emit(ctx, "", data)
            elif sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J" + text + "\n\n(Ctrl-C to stop)\n")
            else:   # a pipe or a file gets one plain frame after another, no escape codes
                sys.stdout.write(text + "\n\n")
                sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK
