"""The operator's writes on exports (create, cancel, edit, replace, reconcile, correct): their parsers
and handlers. Each write goes through its app/store function after the operator's grant for the tenant
is checked. The store's answers map to exit codes here, deliberately."""

from __future__ import annotations

import argparse
import uuid
from typing import assert_never

from app.cli import bulk
from app.cli import lookup as cli_lookup
from app.cli.common import (
    CANCEL_DONE,
    EXIT_BUSY,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    CliError,
    Context,
    Exit,
    bad_input,
    busy,
    command,
    job_command,
    name,
    not_found,
    positive_int,
    refused,
    seconds_arg,
    status_arg,
    text,
    time_arg,
    uuid_arg,
)
from app.cli.output import emit
from app.delivery import naming
from app.store import cancellation, creation, export, pausing
from app.store.types import (
    CancellationOutcome,
    CancellationReply,
    EditResult,
    FailureCode,
    Role,
    Status,
)

_OUTCOME_TEXT = {
    CancellationOutcome.CANCELED_WHILE_QUEUED: "canceled: it had not started",
    CancellationOutcome.STOP_REQUESTED: "stop requested: it is being built; the worker stops before delivery",
    CancellationOutcome.STOP_ALREADY_REQUESTED: "a stop was already requested; the worker stops before delivery",
    CancellationOutcome.ALREADY_CANCELED: "already canceled",
    CancellationOutcome.ALREADY_ENDED: "already ended",
    CancellationOutcome.TOO_LATE: "too late: delivery was already authorized; the request is recorded, not obeyed",
}


def register(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "create", help_="queue an export of a tenant's contacts",
                description="Queue an export of the tenant's contacts to a destination; prints its id and the "
                            "request id. Submitted again with the same --request-id (a double click, a retry after "
                            "a lost reply or a busy answer), it answers the export already created and says it is "
                            "a replay; nothing new is queued.",
                exits=(EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_BUSY))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")
    p.add_argument("--by", required=True, type=name, help="the operator")
    _request_options(p, "the submission's id (minted and printed when not given)")
    p.set_defaults(handler=create)

    p = command(commands, "cancel", help_="cancel an export, or request that it stop (or a tenant's whole queue)",
                description="Record a cancellation request. Queued: canceled. Being built: stop requested. Delivery "
                            "authorized: too late (recorded, not obeyed). Every recorded outcome exits 0. The request "
                            "id is printed; after a busy answer (75) retry with the same --request-id. --all-queued "
                            "instead cancels every Queued export of the tenant, each through the same statement under "
                            "a request id derived from --request-id and the export (a retry replays each), printing "
                            "each export's outcome and a summary; --dry-run lists them and writes nothing.",
                exits=(Exit(EXIT_OK, CANCEL_DONE), EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_BUSY, EXIT_FAILURE))
    p.add_argument("job", nargs="?", type=uuid_arg, metavar="JOB", help="the export's id (or --all-queued)")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--all-queued", action="store_true", help="every Queued export of the tenant")
    p.add_argument("--dry-run", action="store_true", help="with --all-queued: list them, cancel nothing")
    p.add_argument("--destination", type=name, help="with --all-queued: only those to this destination")
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.add_argument("--request-id", type=uuid_arg, help="the click's id (minted and printed when not given)")
    p.add_argument("--reason", type=text())
    p.add_argument("--lock-timeout", type=seconds_arg, default=2.0,
                   help="seconds to wait for the export's row lock before answering busy (default 2)")
    p.set_defaults(handler=cancel)

    p = job_command(commands, "edit", "change a queued export's destination",
                    "Change a queued export's destination, at the version you saw (see show).",
                    exits=(EXIT_REFUSED,))
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")
    p.add_argument("--expected-version", required=True, type=positive_int(2**31 - 1))
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=edit)

    p = command(commands, "replace", help_="queue a replacement delivery for an export (or for every one not "
                                           "delivered since a time)",
                description="Queue a replacement of an export that ended OutcomeUnknown or failed without finalizing "
                            "a file. Naming a replacement means its original. Submitted again with the same "
                            "--request-id, it answers the replacement already created (the first reason stands). "
                            "--all-not-delivered --since TIME instead replaces every export of the tenant that failed "
                            "without finalizing a file (BuildFailed, AttemptsExhausted, NotDelivered) and ended at or "
                            "after TIME, each original once, under a request id derived from --request-id and the "
                            "original (a retry replays each), printing each answer and a summary; --dry-run lists "
                            "them and writes nothing.",
                exits=(EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_BUSY, EXIT_FAILURE))
    p.add_argument("job", nargs="?", type=uuid_arg, metavar="JOB", help="the export's id (or --all-not-delivered)")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--all-not-delivered", action="store_true",
                   help="every export of the tenant that ended without a file since --since")
    p.add_argument("--since", type=time_arg, metavar="TIME",
                   help="with --all-not-delivered: ended at or after TIME (ISO 8601, UTC without an offset)")
    p.add_argument("--dry-run", action="store_true", help="with --all-not-delivered: list them, replace nothing")
    p.add_argument("--destination", type=name, help="with --all-not-delivered: only those to this destination "
                                                    "(a partner's outage)")
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.add_argument("--reason", required=True, type=text())
    p.add_argument("--overwrite-agreement", type=text(), help="the partner's recorded overwrite agreement")
    _request_options(p, "the submission's id (minted and printed when not given)")
    p.set_defaults(handler=replace)

    p = job_command(commands, "reconcile", "settle an OutcomeUnknown attempt from evidence",
                    "Settle an OutcomeUnknown attempt to Completed, or Failed (NotDelivered), once, on evidence.",
                    exits=(EXIT_REFUSED,))
    p.add_argument("--attempt", required=True, type=uuid_arg)
    p.add_argument("--to", required=True, type=_outcome, help="Completed or Failed")
    p.add_argument("--evidence", required=True, type=text())
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=reconcile)

    p = job_command(commands, "correct", "correct a recorded Completed or Failed (reconciliation operators)",
                    "Correct a recorded Completed or Failed of one attempt, once, as exports_reconciler. Only for "
                    "operators granted with --reconciliation.", exits=(EXIT_REFUSED,))
    p.add_argument("--attempt", required=True, type=uuid_arg)
    p.add_argument("--from", dest="from_", required=True, type=_outcome, help="the recorded outcome")
    p.add_argument("--to", required=True, type=_outcome, help="the corrected outcome")
    p.add_argument("--failure-reason", type=_failure_code, help="with --to Failed")
    p.add_argument("--evidence-ref", required=True, type=text())
    p.add_argument("--why", required=True, type=text())
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=correct)


def _request_options(p: argparse.ArgumentParser, help_: str) -> None:
    p.add_argument("--request-id", type=uuid_arg, help=help_ + "; after a busy answer (75) or a lost reply, "
                   "retry with the same --request-id")
    p.add_argument("--lock-timeout", type=seconds_arg, default=2.0,
                   help="seconds to wait for a lock before answering busy (default 2)")


def _outcome(value: str) -> Status:
    status = status_arg(value)
    if status not in (Status.COMPLETED, Status.FAILED):
        raise argparse.ArgumentTypeError("must be Completed or Failed")
    return status


_outcome.__name__ = "outcome"


def _failure_code(value: str) -> FailureCode:
    for code in FailureCode:
        if value.lower() == code.value.lower():
            return code
    raise argparse.ArgumentTypeError(f"unknown failure reason; one of: {', '.join(c.value for c in FailureCode)}")


_failure_code.__name__ = "failure reason"


def _lock_timeout(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def create(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    destination = cli_lookup.destination(views, tenant, args.destination)
    request_id = args.request_id or uuid.uuid4()
    answer = naming.submit_create(ctx.connection, tenant_id=tenant.id, destination_id=destination.id,
                                  requested_by=args.by, request_id=request_id,
                                  lock_timeout=_lock_timeout(args.lock_timeout))
    _refuse_unless_created(answer, f"in tenant {tenant.name!r}")
    replay = _replay_text(answer)
    held = _held(ctx, tenant.id, destination.id)
    emit(ctx, f"export {answer.job_id} queued for {destination.name!r} (file {answer.file_name}; "
              f"request {request_id}{replay})" + (f"; {held}: it waits until resumed" if held else ""),
         {"job_id": str(answer.job_id), "tenant_id": str(tenant.id), "destination_id": str(destination.id),
          "delivery_key": answer.delivery_key, "final_name": answer.file_name, "request_id": str(request_id),
          "replay": answer.replay_of is not None, "recorded_at": answer.replay_of, "held": held})
    return EXIT_OK


def _held(ctx: Context, tenant_id: uuid.UUID, destination_id: uuid.UUID) -> str | None:
    """Why an export queued now would wait for a resume (its tenant or destination paused), if it would."""
    with ctx.connection() as conn:
        pause = pausing.read_destination(conn, tenant_id=tenant_id, destination_id=destination_id)
    if pause is None:
        return None
    if pause.tenant_paused_at is not None:
        return "its tenant is paused"
    return None if pause.state is None else f"its destination is {pause.state.value}"


def _replay_text(answer: creation.CreateAnswer) -> str:
    if answer.replay_of is None:
        return ""
    return f"; a replay of the request recorded {answer.replay_of:%Y-%m-%d %H:%M:%S}: nothing new queued"


def _refuse_unless_created(answer: creation.CreateAnswer, where: str) -> None:
    """Raises the answer's one line when nothing was created, naming the request id to retry with."""
    request_id, reply = answer.request_id, answer.reply
    data = {"request_id": str(request_id), "reply": reply.value}
    match reply:
        case creation.CreateReply.CREATED:
            return
        case creation.CreateReply.BUSY:
            raise busy(f"busy: a lock was held too long; nothing recorded; retry with --request-id {request_id}",
                       **data)
        case creation.CreateReply.REQUEST_ID_REUSED:
            raise refused(f"RequestIdReused: request id {request_id} was already used for other terms or by "
                          "another operator; nothing recorded", **data)
        case creation.CreateReply.UNKNOWN_DESTINATION:
            raise not_found(f"no such destination {where}; nothing recorded", **data)
        case creation.CreateReply.KEY_TAKEN:
            raise refused(f"the minted delivery key is taken {where}; nothing created", **data)
        case creation.CreateReply.NOT_ALLOWED | creation.CreateReply.SLOT_TAKEN:
            raise AssertionError("a replacement's refusal is answered by replace")   # pragma: no cover
        case creation.CreateReply.UNKNOWN:
            raise CliError(EXIT_FAILURE, f"the database's reply was lost and it could not be asked again: retry "
                                         f"with --request-id {request_id} (it answers what was recorded)", **data)
    assert_never(reply)


def _one_or_all(args: argparse.Namespace, flag: str, all_: bool) -> None:
    """A bulk flag instead of JOB, never both; --dry-run (and --since) only with the flag."""
    if all_ == (args.job is not None):
        raise bad_input(f"name one export (JOB) or {flag}, not both" if all_ else f"name an export (JOB) or {flag}")
    if not all_ and (args.dry_run or args.destination):
        raise bad_input(f"--{'dry-run' if args.dry_run else 'destination'} goes with {flag}")


def cancel(ctx: Context, args: argparse.Namespace) -> int:
    _one_or_all(args, "--all-queued", args.all_queued)
    if args.all_queued:
        return bulk.cancel_queued(ctx, args, _lock_timeout(args.lock_timeout))
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    request_id = args.request_id or uuid.uuid4()
    with ctx.connection() as conn:
        result = cancellation.request_cancellation(
            conn, tenant_id=tenant.id, job_id=args.job, request_id=request_id, requested_by=args.by,
            reason=args.reason, lock_timeout=_lock_timeout(args.lock_timeout))
    reply = result.reply
    if reply is CancellationReply.RECORDED:
        assert result.outcome is not None
        found = result.found_status.value if result.found_status else None
        replay = (f"; a replay of request {request_id}, recorded {result.replay_of:%Y-%m-%d %H:%M:%S}"
                  if result.replay_of else f"; request {request_id}")
        emit(ctx, f"{_OUTCOME_TEXT[result.outcome]} (found {found}{replay})",
             {"job_id": str(args.job), "request_id": str(request_id), "reply": reply.value,
              "outcome": result.outcome.value, "found_status": found,
              "found_attempt_id": result.found_attempt_id, "found_attempt_count": result.found_attempt_count,
              "found_delivery_authorized_at": result.found_delivery_authorized_at,
              "replay": result.replay_of is not None, "recorded_at": result.replay_of})
        return EXIT_OK
    if reply is CancellationReply.NOT_FOUND:
        raise not_found(f"no export {args.job} in tenant {tenant.name!r}; nothing recorded",
                        request_id=str(request_id), reply=reply.value)
    if reply is CancellationReply.REQUEST_ID_REUSED:
        raise refused(f"request id {request_id} was already used for another export or operator; nothing recorded",
                      request_id=str(request_id), reply=reply.value)
    if reply is CancellationReply.BUSY:
        raise busy(f"busy: export {args.job} is locked; nothing recorded; retry with --request-id {request_id}",
                   request_id=str(request_id), reply=reply.value)
    assert_never(reply)


def edit(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    job = cli_lookup.job(views, tenant, args.job)
    destination = cli_lookup.destination(views, tenant, args.destination)
    with ctx.connection() as conn:
        outcome = export.edit_terms(conn, tenant_id=tenant.id, job_id=job.id, expected_version=args.expected_version,
                                  destination_id=destination.id)
    if outcome.result is EditResult.NOT_CHANGED:
        current = cli_lookup.job(views, tenant, args.job)
        why = (f"it already goes to {destination.name!r}" if current.destination_id == destination.id else
               f"terms change only while Queued, at the expected version {args.expected_version}")
        raise refused(f"NotChanged: export {job.id} is {current.status} at version {current.version} ({why})",
                      reply=outcome.result.value, status=current.status, version=current.version)
    emit(ctx, f"export {job.id} now goes to {destination.name!r} (version {outcome.version})",
         {"job_id": str(job.id), "result": outcome.result.value, "version": outcome.version,
          "destination_id": str(destination.id)})
    return EXIT_OK


def replace(ctx: Context, args: argparse.Namespace) -> int:
    _one_or_all(args, "--all-not-delivered", args.all_not_delivered)
    if args.all_not_delivered != (args.since is not None):
        raise bad_input("--all-not-delivered needs --since TIME, and --since goes only with it")
    if args.all_not_delivered:
        return bulk.replace_not_delivered(ctx, args, _lock_timeout(args.lock_timeout))
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    named = cli_lookup.job(views, tenant, args.job)
    # A replacement always names the original, so naming a replacement means its original.
    original = cli_lookup.job(views, tenant, named.replaces_job_id) if named.replaces_job_id else named
    request_id = args.request_id or uuid.uuid4()
    answer = creation.submit_replacement(
        ctx.connection, tenant_id=tenant.id, request_id=request_id, job_id=uuid.uuid4(), original_job_id=original.id,
        requested_by=args.by, replacement_reason=args.reason, overwrite_agreement_ref=args.overwrite_agreement,
        lock_timeout=_lock_timeout(args.lock_timeout))
    data = {"request_id": str(request_id), "reply": answer.reply.value, "original_job_id": str(original.id)}
    if answer.reply is creation.CreateReply.NOT_ALLOWED:
        current = cli_lookup.job(views, tenant, original.id)
        reason = f", {current.failure_reason}" if current.failure_reason else ""
        raise refused(f"NotAllowed: original {original.id} is {current.status}{reason}; only an OutcomeUnknown "
                      "original, or one that failed without finalizing a file, may be replaced", **data)
    if answer.reply is creation.CreateReply.SLOT_TAKEN:
        raise refused(f"SlotTaken: original {original.id} already has a live or delivered replacement", **data)
    _refuse_unless_created(answer, f"in tenant {tenant.name!r}")
    emit(ctx, f"replacement {answer.job_id} queued for original {original.id} (request {request_id}"
              f"{_replay_text(answer)})",
         {"job_id": str(answer.job_id), "original_job_id": str(original.id), "result": answer.reply.value,
          "request_id": str(request_id), "replay": answer.replay_of is not None, "recorded_at": answer.replay_of})
    return EXIT_OK


def reconcile(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant)
    job = cli_lookup.job(views, tenant, args.job)
    with ctx.connection() as conn:
        written = export.reconcile(conn, tenant_id=tenant.id, job_id=job.id, attempt_id=args.attempt,
                                     resolution=args.to, evidence=args.evidence, reconciled_by=args.by)
    if not written:
        current = cli_lookup.job(views, tenant, job.id)
        why = ("only an OutcomeUnknown attempt is reconciled, once; and an original is not reconciled Completed once "
               "a replacement of it has passed cutoff 2 (a file under the shared name may be the replacement's)"
               if current.status == Status.OUTCOME_UNKNOWN.value and current.replaces_job_id is None
               else "only an OutcomeUnknown attempt is reconciled, once")
        raise refused(f"NotChanged: export {job.id} is {current.status} with attempt {current.attempt_id}; {why}",
                      status=current.status)
    emit(ctx, f"export {job.id} reconciled to {args.to.value}", {"job_id": str(job.id), "status": args.to.value})
    return EXIT_OK


def correct(ctx: Context, args: argparse.Namespace) -> int:
    if args.to is Status.FAILED and args.failure_reason is None:
        raise bad_input("--to Failed needs --failure-reason")
    if args.to is not Status.FAILED and args.failure_reason is not None:
        raise bad_input("--failure-reason goes only with --to Failed")
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    cli_lookup.require_grant(views, args.by, tenant, reconciliation=True)
    job = cli_lookup.job(views, tenant, args.job)
    with ctx.connection(Role.RECONCILER) as conn:
        written = export.correct(conn, tenant_id=tenant.id, job_id=job.id, attempt_id=args.attempt,
                                   recorded_status=args.from_, corrected_status=args.to,
                                   failure_reason=args.failure_reason, evidence_ref=args.evidence_ref, why=args.why,
                                   corrected_by=args.by)
    if not written:
        current = cli_lookup.job(views, tenant, job.id)
        raise refused(f"NotChanged: export {job.id} is {current.status} with attempt {current.attempt_id}; "
                      f"a correction changes a recorded {args.from_.value} of that attempt once",
                      status=current.status)
    emit(ctx, f"export {job.id} corrected from {args.from_.value} to {args.to.value}",
         {"job_id": str(job.id), "from": args.from_.value, "to": args.to.value})
    return EXIT_OK

