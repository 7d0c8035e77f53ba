"""The bulk actions of ``replace`` and ``cancel``: every export of a tenant that ended without a file since a
time, replaced; every Queued export of a tenant, canceled. Each export goes through the same idempotent
store call as the single command, under a request id derived from the bulk's own (minted and printed
when not given) and the export's id, so a bulk run retried with its ``--request-id`` replays each export's
answer instead of acting twice, and one interrupted half-way finishes the rest. ``--dry-run`` lists what
would be done and writes nothing. Each export's answer is printed, then a summary.
"""

from __future__ import annotations

import argparse
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from app.cli import lookup as cli_lookup
from app.cli.common import EXIT_BUSY, EXIT_FAILURE, EXIT_OK, EXIT_REFUSED, Context, printable
from app.cli.output import emit, table
from app.store import cancellation, creation
from app.store.types import CancellationReply

Row = dict[str, Any]


def derived_request_id(bulk_request_id: UUID, job_id: UUID) -> UUID:
    """One export's request id within a bulk action: the same for a retry of the same bulk request."""
    return uuid.uuid5(bulk_request_id, str(job_id))


def replace_not_delivered(ctx: Context, args: argparse.Namespace, lock_timeout: str) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    request_id = args.request_id or uuid.uuid4()
    originals: dict[UUID, Row] = {}
    destination = cli_lookup.destination(views, tenant, args.destination) if args.destination else None
    for ended in views.ended_without_file(tenant.id, since=args.since,
                                          destination_id=destination.id if destination else None):
        # A failed replacement is replaced by replacing its original again; each original once.
        originals.setdefault(ended.original_id, {
            "original_job_id": ended.original_id, "failed_job_id": ended.id,
            "failure_reason": ended.failure_reason, "ended_at": ended.ended_at})
    rows = list(originals.values())
    if not args.dry_run:
        for row in rows:
            answer = creation.submit_replacement(
                ctx.connection, tenant_id=tenant.id, request_id=derived_request_id(request_id, row["original_job_id"]),
                job_id=uuid.uuid4(), original_job_id=row["original_job_id"], requested_by=args.by,
                replacement_reason=args.reason, overwrite_agreement_ref=args.overwrite_agreement,
                lock_timeout=lock_timeout)
            row["reply"] = answer.reply.value
            row["replay"] = answer.replay_of is not None
            row["job_id"] = answer.job_id
    return _report(ctx, args, "replace", tenant.name, request_id, rows,
                   headers=["original", "failed export", "reason", "ended", "answer", "replacement"],
                   cells=lambda r: [r["original_job_id"], r["failed_job_id"], r["failure_reason"], r["ended_at"],
                                    _answer(r), r.get("job_id")],
                   since=args.since)


def cancel_queued(ctx: Context, args: argparse.Namespace, lock_timeout: str) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    request_id = args.request_id or uuid.uuid4()
    destination = cli_lookup.destination(views, tenant, args.destination) if args.destination else None
    rows: list[Row] = [{"job_id": job_id} for job_id in views.queued_ids(
        tenant.id, destination_id=destination.id if destination else None)]
    if not args.dry_run:
        for row in rows:
            with ctx.connection() as conn:
                result = cancellation.request_cancellation(
                    conn, tenant_id=tenant.id, job_id=row["job_id"],
                    request_id=derived_request_id(request_id, row["job_id"]), requested_by=args.by,
                    reason=args.reason, lock_timeout=lock_timeout)
            row["reply"] = result.reply.value
            row["replay"] = result.replay_of is not None
            row["outcome"] = result.outcome.value if result.outcome else None
            row["found_status"] = result.found_status.value if result.found_status else None
    return _report(ctx, args, "cancel", tenant.name, request_id, rows,
                   headers=["export", "answer", "found"],
                   cells=lambda r: [r["job_id"], _answer(r), r.get("found_status")])


def _answer(row: Row) -> str:
    if "reply" not in row:
        return "(dry run)"
    answer = row.get("outcome") or row["reply"]
    return f"{answer} (replay)" if row["replay"] else answer


def _report(ctx: Context, args: argparse.Namespace, verb: str, tenant_name: str, request_id: UUID, rows: list[Row],
            *, headers: list[str], cells: Callable[[Row], list[Any]], since: datetime | None = None) -> int:
    summary = dict(Counter(_answer(r).removesuffix(" (replay)") for r in rows))
    replays = sum(1 for r in rows if r.get("replay"))
    what = "would be " + ("replaced" if verb == "replace" else "canceled") if args.dry_run else "answered"
    counts = ", ".join(f"{n} {answer}" for answer, n in summary.items()) or "none"
    line = (f"{len(rows)} exports of tenant {printable(tenant_name, 80)!r} {what}: {counts}"
            + (f" ({replays} replays)" if replays else "") + f"; request {request_id}")
    if any(r.get("reply") == "Busy" for r in rows):
        line += f"; retry with --request-id {request_id} (the others answer as replays)"
    emit(ctx, (table(headers, [cells(r) for r in rows]) + "\n" if rows else "") + line,
         {"request_id": str(request_id), "dry_run": args.dry_run, "since": since, "results": rows,
          "summary": summary, "replays": replays})
    return _exit(r.get("reply") for r in rows)


def _exit(replies: Iterable[str | None]) -> int:
    """Done unless an export's answer needs the operator: a lost reply (1), a busy row (75: retry with the
    same request id), a request id already used for other terms (4)."""
    seen = set(replies)
    if creation.CreateReply.UNKNOWN.value in seen:
        return EXIT_FAILURE
    if CancellationReply.BUSY.value in seen or creation.CreateReply.BUSY.value in seen:
        return EXIT_BUSY
    if CancellationReply.REQUEST_ID_REUSED.value in seen or creation.CreateReply.REQUEST_ID_REUSED.value in seen:
        return EXIT_REFUSED
    return EXIT_OK
