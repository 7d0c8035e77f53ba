"""Reads for operators: one export in full, a list, and a live view. Peewee models only."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import peewee

from app.cli import lookup as cli_lookup
from app.cli.common import EXIT_OK, Context
from app.cli.output import emit, table
from app.store import models
from app.store.types import Status

#: Status order for counts: the job's life, left to right.
STATUS_ORDER = [s.value for s in Status]


def _job_dict(job: models.ExportJob) -> dict[str, Any]:
    data = {f: getattr(job, f) for f in job._meta.sorted_field_names}
    if data.get("expected_file_sha256") is not None:
        data["expected_file_sha256"] = bytes(data["expected_file_sha256"]).hex()
    return data


def show(ctx: Context, args: argparse.Namespace) -> int:
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant)
    job = cli_lookup.job(tenant, args.job)
    events = list(models.AttemptEvent.select().where(models.AttemptEvent.job_id == job.id).order_by(models.AttemptEvent.id))
    requests = list(models.CancellationRequest.select()
                    .where((models.CancellationRequest.tenant_id == tenant.id) & (models.CancellationRequest.job_id == job.id))
                    .order_by(models.CancellationRequest.recorded_at))
    outbox = list(models.OutboxRow.select().where(models.OutboxRow.job_id == job.id).order_by(models.OutboxRow.created_at))
    destination = models.Destination.get_or_none(models.Destination.id == job.destination_id)
    data = {
        "job": _job_dict(job),
        "destination": destination.name if destination else None,
        "events": [{"id": e.id, "attempt_id": e.attempt_id, "kind": e.kind, "version": e.version,
                    "worker_id": e.worker_id, "observed_by": e.observed_by, "detail": e.detail,
                    "recorded_at": e.recorded_at} for e in events],
        "cancellation_requests": [{"id": r.id, "requested_by": r.requested_by, "reason": r.reason, "outcome": r.outcome,
                                   "found_status": r.found_status, "found_attempt_count": r.found_attempt_count,
                                   "recorded_at": r.recorded_at} for r in requests],
        "evidence": [{"attempt_id": e.attempt_id, "observed_by": e.observed_by, "detail": e.detail,
                      "recorded_at": e.recorded_at} for e in events if e.kind == "DeliveryEvidence"],
        "outbox": [{"message_id": o.message_id, "kind": o.kind, "created_at": o.created_at,
                    "published_at": o.published_at} for o in outbox],
    }
    if ctx.json:
        emit(ctx, "", data)
        return EXIT_OK
    lines = [f"export {job.id}  {job.status}" + (f" ({job.failure_reason})" if job.failure_reason else ""),
             f"  tenant {tenant.name!r}  destination {data['destination']!r}  version {job.version}  "
             f"attempts {job.attempt_count}  created by {job.created_by}",
             f"  delivery key {job.delivery_key}"
             + (f"  replaces {job.replaces_job_id} ({job.replacement_reason})" if job.replaces_job_id else "")]
    if job.attempt_id:
        lines.append(f"  attempt {job.attempt_id} by {job.claimed_by}  lease until {job.lease_expires_at}")
    if job.expected_file_name:
        lines.append(f"  expected file {job.expected_file_name}  {job.expected_file_bytes} bytes")
    lines += ["", "attempt events:",
              table(["time", "attempt", "kind", "by", "detail"],
                    [[e.recorded_at, str(e.attempt_id)[:8], e.kind, e.worker_id or e.observed_by, e.detail]
                     for e in events]) if events else "  (none)"]
    lines += ["", "cancellation requests:",
              table(["time", "request", "by", "outcome", "found", "reason"],
                    [[r.recorded_at, str(r.id)[:8], r.requested_by, r.outcome, r.found_status, r.reason]
                     for r in requests]) if requests else "  (none)"]
    lines += ["", "outbox:",
              table(["created", "message", "published"],
                    [[o.created_at, o.message_id, o.published_at] for o in outbox]) if outbox else "  (none)"]
    emit(ctx, "\n".join(lines), data)
    return EXIT_OK


def _created_at():
    return (models.OutboxRow.select(peewee.fn.MIN(models.OutboxRow.created_at))
            .where(models.OutboxRow.job_id == models.ExportJob.id))


def jobs_query(tenant_id=None, status: Status | None = None, limit: int = 100):
    created = _created_at()
    query = (models.ExportJob.select(models.ExportJob, models.Tenant.name.alias("tenant_name"),
                                     models.Destination.name.alias("destination_name"), created.alias("created_at"))
             .join(models.Tenant, on=(models.Tenant.id == models.ExportJob.tenant_id))
             .switch(models.ExportJob)
             .join(models.Destination, peewee.JOIN.LEFT_OUTER, on=(models.Destination.id == models.ExportJob.destination_id)))
    if tenant_id is not None:
        query = query.where(models.ExportJob.tenant_id == tenant_id)
    if status is not None:
        query = query.where(models.ExportJob.status == status.value)
    return query.order_by(peewee.SQL("created_at").desc(nulls="LAST"), models.ExportJob.id).limit(limit).objects()


def _rows(jobs) -> list[list[Any]]:
    return [[j.created_at, j.id, j.tenant_name, j.destination_name, j.status, j.failure_reason or "", j.version,
             j.attempt_count, j.created_by] for j in jobs]


HEADERS = ["created", "export", "tenant", "destination", "status", "reason", "ver", "tries", "by"]


def list_jobs(ctx: Context, args: argparse.Namespace) -> int:
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant) if args.tenant else None
    found = list(jobs_query(tenant.id if tenant else None, args.status, args.limit))
    data = [{"job_id": j.id, "tenant": j.tenant_name, "destination": j.destination_name, "status": j.status,
             "failure_reason": j.failure_reason, "version": j.version, "attempt_count": j.attempt_count,
             "created_by": j.created_by, "created_at": j.created_at} for j in found]
    emit(ctx, table(HEADERS, _rows(found)) if found else "no exports", data)
    return EXIT_OK


def counts(tenant_id=None) -> Counter:
    query = models.ExportJob.select(models.ExportJob.status, peewee.fn.COUNT(models.ExportJob.id).alias("n"))
    if tenant_id is not None:
        query = query.where(models.ExportJob.tenant_id == tenant_id)
    return Counter({row.status: row.n for row in query.group_by(models.ExportJob.status)})


def render_watch(tenant_id=None, limit: int = 15) -> tuple[str, dict[str, Any]]:
    by_status = counts(tenant_id)
    recent = list(jobs_query(tenant_id, None, limit))
    summary = "  ".join(f"{s}: {by_status.get(s, 0)}" for s in STATUS_ORDER)
    text = f"exports by state ({time.strftime('%H:%M:%S')})\n{summary}\n\n" + (table(HEADERS, _rows(recent)) if recent else "no exports")
    return text, {"counts": {s: by_status.get(s, 0) for s in STATUS_ORDER},
                  "recent": [{"job_id": j.id, "status": j.status} for j in recent]}


def watch(ctx: Context, args: argparse.Namespace) -> int:
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant) if args.tenant else None
    tenant_id = tenant.id if tenant else None
    if args.once:
        text, data = render_watch(tenant_id, args.limit)
        emit(ctx, text, data)
        return EXIT_OK
    try:
        while True:
            text, data = render_watch(tenant_id, args.limit)
            if ctx.json:
                emit(ctx, "", data)
            else:
                sys.stdout.write("\x1b[H\x1b[2J" + text + "\n\n(Ctrl-C to stop)\n")
                sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK
