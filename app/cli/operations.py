"""Running it: ``exports health`` (readiness; ``--process``: liveness), ``exports processes`` (who is
alive, holding what), and ``exports outbox archive`` (retention). Their parsers and handlers."""

from __future__ import annotations

import argparse
from pathlib import Path

from app import health as health_checks
from app.cli.common import EXIT_OK, EXIT_UNHEALTHY, Context, Exit, command, group, text
from app.cli.output import emit, table
from app.heartbeat import SILENT_INTERVALS
from app.store import heartbeat, retention

#: Days of published outbox rows kept by default; the history tables are kept for good.
DEFAULT_RETENTION_DAYS = 30.0


def register(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "health", help_="is the deployment doing its job? (a readiness check; --process: liveness)",
                description="Check that the whole deployment is doing its job (database, schema, broker, relay lag, "
                            "recovery, queue, webhooks): exit 0 only when every check passes, 69 when one fails, "
                            "saying why. It is a readiness check of the deployment, the same answer on every host, "
                            "not a liveness probe: a supervisor restarting the process that asked would cure "
                            "nothing. For liveness, --process ROLE asks this host's process of that role for its "
                            "own metrics endpoint, without the database.",
                exits=(Exit(EXIT_UNHEALTHY, "unhealthy: a check failed (each failed one says why)"),))
    checks = p.add_mutually_exclusive_group()
    checks.add_argument("--require", type=_roles, default=(), metavar="ROLES",
                        help="also require a live process (a recent heartbeat) of each role (comma separated: "
                             f"{', '.join(health_checks.ROLES)})")
    checks.add_argument("--process", choices=health_checks.ROLES, metavar="ROLE",
                        help="liveness of this host's process of ROLE only: its metrics endpoint "
                             "(EXPORTS_<ROLE>_METRICS) answers")
    p.set_defaults(handler=health)

    p = command(commands, "processes", help_="relays, workers and schedulers: alive, stopped or silent",
                description="List the processes that recorded heartbeats, with host, pid, role and state, and for "
                            "a worker the attempts it holds now (each attempt's claimed_by names its process). "
                            "'signal pid' is the one to stop it by: a worker process's exports worker, which "
                            "drains all its worker processes; the process itself for the others.")
    p.set_defaults(handler=processes)

    outbox = group(commands, "outbox", "the outbox's retention")
    p = command(outbox, "archive", help_="archive, then delete, published outbox rows past their retention",
                description="Write published outbox rows older than --older-than days to gzipped JSON-lines files "
                            "in --to, then delete them; unpublished rows are never touched, and the history tables "
                            "are kept. Runs as exports_retention: the login must be a member of it (the database "
                            "owner is).")
    p.add_argument("--older-than", type=_days, default=DEFAULT_RETENTION_DAYS, metavar="DAYS",
                   help=f"days since publication (default {DEFAULT_RETENTION_DAYS:g})")
    p.add_argument("--to", required=True, type=text(4096), metavar="DIR", help="directory for the archive files")
    p.set_defaults(handler=outbox_archive)


def _roles(value: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in value.split(",") if r.strip())
    unknown = [r for r in roles if r not in health_checks.ROLES]
    if unknown or not roles:
        raise argparse.ArgumentTypeError(f"roles are {', '.join(health_checks.ROLES)}")
    return roles


_roles.__name__ = "roles"


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number of days") from None
    if not 0 < days <= 36500:
        raise argparse.ArgumentTypeError("must be between 0 and 36500 days")
    return days


_days.__name__ = "days"


def health(ctx: Context, args: argparse.Namespace) -> int:
    if args.process:
        checks = [health_checks.probe_process(ctx.settings, args.process)]
    else:
        checks = health_checks.run(ctx.settings, ctx.database_url(), require=args.require)
    healthy = all(c.ok for c in checks)
    emit(ctx, "\n".join(f"{'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in checks),
         {"healthy": healthy, "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks]})
    return EXIT_OK if healthy else EXIT_UNHEALTHY


def processes(ctx: Context, args: argparse.Namespace) -> int:
    silent_limit = SILENT_INTERVALS * ctx.settings.heartbeat_seconds
    with ctx.connection() as conn:
        records = heartbeat.processes(conn)

    def state(record: heartbeat.ProcessRecord) -> str:
        if record.stopped_at is not None:
            return "stopped"
        return "alive" if record.silent_seconds <= silent_limit else "silent"

    rows = [[r.identity.role, r.identity.host, r.identity.pid, _signal_pid(r), state(r), r.identity.version,
             r.identity.started_at, r.beat_at, " ".join(str(a) for a in r.attempts)] for r in records]
    emit(ctx, table(["role", "host", "pid", "signal pid", "state", "version", "started", "last beat",
                     "attempts held"], rows)
         if rows else "no process has recorded a heartbeat",
         [{"process_id": r.identity.process_id, "role": r.identity.role, "host": r.identity.host,
           "pid": r.identity.pid, "signal_pid": _signal_pid(r), "state": state(r), "version": r.identity.version,
           "started_at": r.identity.started_at, "beat_at": r.beat_at, "stopped_at": r.stopped_at,
           "attempts": [str(a) for a in r.attempts]} for r in records])
    return EXIT_OK


def _signal_pid(record: heartbeat.ProcessRecord) -> int:
    """The pid to send SIGTERM to: a worker process's parent (its exports worker, which drains them all),
    else the process itself."""
    return record.identity.parent_pid or record.identity.pid


def outbox_archive(ctx: Context, args: argparse.Namespace) -> int:
    done = retention.archive_published(ctx.database().owner, older_than_seconds=args.older_than * 86400,
                                       archive_dir=Path(args.to))
    emit(ctx, f"{done.rows} published outbox rows archived and deleted"
              + (f" into {len(done.files)} file(s) in {args.to}" if done.files else ""),
         {"archived": done.rows, "files": [str(f) for f in done.files]})
    return EXIT_OK
