"""``exports``: the operator scripts and the processes, one command.

Every subcommand has ``--help``, prints for people by default and one JSON document with ``--json``,
and ends with one of the named exit codes in ``app.cli.common`` (listed in every ``--help``). A bad
input is one line on stderr and its exit code, never a traceback, and changes nothing.

Operators act only for tenants they are granted in ``operator_access``: a write by an operator who
is not granted answers 4 ("not allowed"), checked before any write. A job of another tenant answers
3, exactly like a missing one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from app.cli import jobs as cli_jobs, processes as cli_processes, setup as cli_setup, views as cli_views
from app.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_FAILURE,
    CliError,
    Context,
    Parser,
    name,
    positive_int,
    printable,
    seconds_arg,
    status_arg,
    text,
    uuid_arg,
)
from app.cli.output import error
from app.config import ConfigError, Settings
from app.store.types import Status

log = logging.getLogger("exports.cli")


def _port(value: str) -> int:
    return positive_int(65535)(value)


_port.__name__ = "port"


def _outcome(value: str) -> Status:
    status = status_arg(value)
    if status not in (Status.COMPLETED, Status.FAILED):
        raise argparse.ArgumentTypeError("must be Completed or Failed")
    return status


_outcome.__name__ = "outcome"


def build_parser() -> Parser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    leaf = dict(parents=[common], epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)

    parser = Parser(prog="exports", description="exports: queued CRM contact exports to partner SFTP servers, with safe "
                    "cancellation and recovery; the operator scripts and the processes.",
                    epilog=EXIT_CODES_HELP + "\n\nAn operator's write (--by) needs the operator's grant for the "
                    "tenant (exports operator grant),\nchecked before anything is written; setup commands (db, "
                    "tenant, destination, operator, contacts)\nare for administrators. Another tenant's export "
                    "answers exactly like a missing one.\n\nEXPORTS_DATABASE_URL picks the database; unset, an "
                    "embedded PostgreSQL runs under EXPORTS_STATE_DIR (default ./var).",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True

    def group(name_: str, help_: str) -> argparse._SubParsersAction:
        p = commands.add_parser(name_, help=help_, description=help_)
        sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
        sub.required = True
        return sub

    # --- setup ---------------------------------------------------------------------------------
    db = group("db", "the database schema")
    p = db.add_parser("migrate", help="apply schema.sql (a second run changes nothing)",
                      description="Apply schema.sql under an advisory lock; a second run changes nothing.", **leaf)
    p.set_defaults(handler=cli_setup.db_migrate)

    tenant = group("tenant", "tenants")
    p = tenant.add_parser("add", help="add a tenant and print its id", description="Add a tenant and print its id.", **leaf)
    p.add_argument("name", type=name)
    p.set_defaults(handler=cli_setup.tenant_add)

    destination = group("destination", "partner SFTP destinations")
    p = destination.add_parser(
        "add", help="add a tenant's partner destination, its host key pinned", **leaf,
        description="Add a partner SFTP destination. The host key is pinned from --host-key (one known_hosts "
                    "line), or fetched once with --fetch-host-key and pinned only with --yes. The credential "
                    "is a reference (env:VAR or keyfile:/path), never the secret.")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--name", required=True, type=name)
    p.add_argument("--host", required=True, type=text(255))
    p.add_argument("--port", type=_port, default=22)
    p.add_argument("--username", required=True, type=text(255))
    p.add_argument("--remote-dir", required=True, type=text(1024))
    p.add_argument("--credential-ref", required=True, type=text(1024), help="env:VAR, keyfile:/path or env-keyfile:VAR")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--host-key", type=text(16384), help='one known_hosts line: "[host]:port keytype base64"')
    key.add_argument("--fetch-host-key", action="store_true", help="fetch the server's key now (needs --yes to pin)")
    p.add_argument("--yes", action="store_true", help="confirm pinning the fetched host key")
    p.add_argument("--remote-hash", action="store_true", help="the server answers check-file-name sha256")
    p.add_argument("--acknowledgments", action="store_true", help="the partner writes <final>.ack")
    p.add_argument("--name-and-size-identify", action="store_true", help="the contract: name and size identify a file")
    p.add_argument("--read-back", action="store_true", help="the contract allows downloading a file to hash it")
    p.set_defaults(handler=cli_setup.destination_add)

    operator = group("operator", "operator access")
    p = operator.add_parser("grant", help="let an operator act for a tenant", **leaf,
                            description="Let an operator act for a tenant; --reconciliation also allows corrections.")
    p.add_argument("--operator", required=True, type=name)
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--reconciliation", action="store_true", help="may correct recorded outcomes")
    p.set_defaults(handler=cli_setup.operator_grant)

    contacts = group("contacts", "a tenant's contacts")
    p = contacts.add_parser("import", help="load contacts from a CSV file (all or nothing)", **leaf,
                            description="Load contacts from a UTF-8 CSV file with a header: email, full_name "
                                        "(required), company, phone, consent (optional). Every row is checked "
                                        "before any is loaded; one bad row loads nothing.")
    p.add_argument("file", type=text(4096))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.set_defaults(handler=cli_setup.contacts_import)
    p = contacts.add_parser("generate", help="generate realistic fake contacts (COPY)", **leaf,
                            description="Generate realistic fake contacts in one COPY.")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--count", required=True, type=positive_int(10_000_000))
    p.add_argument("--seed", type=int, help="for a reproducible set")
    p.set_defaults(handler=cli_setup.contacts_generate)

    # --- exports -------------------------------------------------------------------------------
    def job_parser(cmd: str, help_: str, description: str) -> argparse.ArgumentParser:
        p = commands.add_parser(cmd, help=help_, description=description, **leaf)
        p.add_argument("job", type=uuid_arg, metavar="JOB", help="the export's id")
        p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
        return p

    p = commands.add_parser("create", help="queue an export of a tenant's contacts", **leaf,
                            description="Queue an export of the tenant's contacts to a destination; prints its id.")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=cli_jobs.create)

    p = job_parser("cancel", "cancel an export, or request that it stop",
                   "Record a cancellation request. Queued: canceled. Being built: stop requested. Delivery "
                   "authorized: too late (recorded, not obeyed). Every recorded outcome exits 0. The request id is "
                   "printed; after a busy answer (75) retry with the same --request-id.")
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.add_argument("--request-id", type=uuid_arg, help="the click's id (minted and printed when not given)")
    p.add_argument("--reason", type=text())
    p.add_argument("--lock-timeout", type=seconds_arg, default=2.0,
                   help="seconds to wait for the export's row lock before answering busy (default 2)")
    p.set_defaults(handler=cli_jobs.cancel)

    p = job_parser("edit", "change a queued export's destination",
                   "Change a queued export's destination, at the version you saw (see show).")
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")
    p.add_argument("--expected-version", required=True, type=positive_int(2**31 - 1))
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=cli_jobs.edit)

    p = job_parser("replace", "queue a replacement delivery for an export",
                   "Queue a replacement of an export that ended OutcomeUnknown or failed without finalizing a file. "
                   "Naming a replacement means its original.")
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.add_argument("--reason", required=True, type=text())
    p.add_argument("--overwrite-agreement", type=text(), help="the partner's recorded overwrite agreement")
    p.set_defaults(handler=cli_jobs.replace)

    p = job_parser("reconcile", "settle an OutcomeUnknown attempt from evidence",
                   "Settle an OutcomeUnknown attempt to Completed, or Failed (NotDelivered), once, on evidence.")
    p.add_argument("--attempt", required=True, type=uuid_arg)
    p.add_argument("--to", required=True, type=_outcome, help="Completed or Failed")
    p.add_argument("--evidence", required=True, type=text())
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=cli_jobs.reconcile)

    p = job_parser("correct", "correct a recorded Completed or Failed (reconciliation operators)",
                   "Correct a recorded Completed or Failed of one attempt, once, as exports_reconciler. Only for "
                   "operators granted with --reconciliation.")
    p.add_argument("--attempt", required=True, type=uuid_arg)
    p.add_argument("--from", dest="from_", required=True, type=_outcome, help="the recorded outcome")
    p.add_argument("--to", required=True, type=_outcome, help="the corrected outcome")
    p.add_argument("--failure-reason", type=cli_jobs.failure_code, help="with --to Failed")
    p.add_argument("--evidence-ref", required=True, type=text())
    p.add_argument("--why", required=True, type=text())
    p.add_argument("--by", required=True, type=name, help="the operator")
    p.set_defaults(handler=cli_jobs.correct)

    p = job_parser("show", "one export: row, attempt events, cancellation requests, evidence, outbox",
                   "Show one export: its row, attempt events, cancellation requests, delivery evidence and outbox.")
    p.set_defaults(handler=cli_views.show)

    p = commands.add_parser("list", help="list exports", description="List exports, newest first.", **leaf)
    p.add_argument("--tenant", type=name, help="tenant id or exact name")
    p.add_argument("--status", type=status_arg)
    p.add_argument("--limit", type=positive_int(100_000), default=100)
    p.set_defaults(handler=cli_views.list_jobs)

    p = commands.add_parser("watch", help="live view of exports by state (Ctrl-C to stop)", **leaf,
                            description="A live view of exports by state, refreshing (Ctrl-C to stop).")
    p.add_argument("--tenant", type=name, help="tenant id or exact name")
    p.add_argument("--interval", type=seconds_arg, default=1.0)
    p.add_argument("--limit", type=positive_int(1000), default=15)
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.set_defaults(handler=cli_views.watch)

    # --- processes -----------------------------------------------------------------------------
    p = commands.add_parser("relay", help="publish the outbox to the broker (SIGINT/SIGTERM to stop)", **leaf,
                            description="Publish unpublished outbox rows to the broker until SIGINT or SIGTERM.")
    p.set_defaults(handler=cli_processes.relay)
    p = commands.add_parser("scheduler", help="recovery, sweeper and scavenger (SIGINT/SIGTERM to stop)", **leaf,
                            description="Run recovery, the sweeper and the scavenger until SIGINT or SIGTERM.")
    p.set_defaults(handler=cli_processes.scheduler)
    p = commands.add_parser("worker", help="run export workers (dramatiq app.actors.worker)", **leaf,
                            description="Run `dramatiq app.actors.worker` with the embedded services resolved.")
    p.add_argument("--processes", type=positive_int(256), default=cli_processes.DEFAULT_PROCESSES,
                   help=f"worker processes (default {cli_processes.DEFAULT_PROCESSES}: this machine's CPUs, at most 4)")
    p.add_argument("--threads", type=positive_int(256), default=cli_processes.DEFAULT_THREADS,
                   help=f"threads per process (default {cli_processes.DEFAULT_THREADS})")
    p.set_defaults(handler=cli_processes.worker)
    p = commands.add_parser("demo", help="run the whole system on this machine through a scripted scenario", **leaf,
                            description="Start the embedded services, relay, two workers and the scheduler, play a "
                                        "scenario, print the outcome and stop everything (--keep leaves it running).")
    p.add_argument("--keep", action="store_true", help="leave everything running and print the environment")
    p.add_argument("--stop", action="store_true", help="stop what a demo started with --keep left running")
    p.set_defaults(handler=cli_processes.demo)
    return parser


#: Commands that run until stopped and log for themselves.
LONG_RUNNING = (cli_processes.relay, cli_processes.scheduler, cli_processes.worker, cli_processes.demo)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        error(None, EXIT_BAD_INPUT, str(exc))
        return EXIT_BAD_INPUT
    ctx = Context(settings, json=getattr(args, "json", False))
    if args.handler not in LONG_RUNNING:
        # An operator script answers in one line; library log records would add lines of their own
        # (long-running processes configure their logging themselves).
        if os.environ.get("EXPORTS_DEBUG"):
            logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        else:
            logging.getLogger().addHandler(logging.NullHandler())
    try:
        return args.handler(ctx, args)
    except CliError as exc:
        error(ctx, exc.code, exc.message, exc.data)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place a surprise becomes one line instead of a traceback
        if os.environ.get("EXPORTS_DEBUG"):
            log.exception("unexpected failure")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error(ctx, EXIT_FAILURE, f"{type(exc).__name__}: {printable(message, 300)}")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
