"""``exports``: the operator scripts and the processes, one command.

Every subcommand has ``--help``, prints for people by default and one JSON document with ``--json``,
and ends with one of the named exit codes in ``app.cli.common``: ``exports --help`` lists them all, each
command's ``--help`` the ones it can end with. Every error ends as one line on stderr and its exit code
(``app.cli.common.exit_code``), never a traceback; a bad input changes nothing.

Operators act only for tenants they are granted in ``operator_access``: a write by an operator who
is not granted answers 4 ("not allowed"), checked before any write. A job of another tenant answers
3, exactly like a missing one.

Each command module registers its own parsers, beside its handlers; this module only builds the
top-level parser and runs the handler the arguments name. Packages installed beside the product may add
commands through the ``exports.commands`` entry point group (the repository's test equipment adds
``exports demo`` and ``exports chaos`` this way): each entry point names a module with a
``register(subparsers)``, exactly like the product's own command modules.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint, entry_points

from app import __version__, logs
from app.cli import destinations, jobs, operations, preview, processes, schedules, setup, tenants, views, webhooks
from app.cli.common import (
    EXIT_FAILURE,
    EXIT_MEANINGS,
    CliError,
    Context,
    Parser,
    UsageError,
    command,
    exit_code,
    exit_codes_help,
    printable,
)
from app.cli.output import error, usage
from app.config import Settings

log = logs.get(__name__)

#: The command modules, in the order ``exports --help`` lists their commands.
COMMAND_MODULES = (setup, tenants, destinations, webhooks, preview, jobs, schedules, views, operations, processes)
#: The entry point group through which installed packages add commands.
PLUGIN_GROUP = "exports.commands"
#: The end of ``exports --help``, after the exit codes.
ABOUT = ("An operator's write (--by) needs the operator's grant for the tenant (exports operator grant),\n"
         "checked before anything is written; setup commands (db, tenant, destination, operator, contacts)\n"
         "are for administrators. Another tenant's export answers exactly like a missing one.\n\n"
         "EXPORTS_DATABASE_URL picks the database; unset, an embedded PostgreSQL runs under EXPORTS_STATE_DIR "
         "(default ./var).")


def build_parser() -> Parser:
    parser = Parser(prog="exports",
                    description="exports: queued CRM contact exports to partner SFTP servers, with safe "
                    "cancellation and recovery; the operator scripts and the processes.",
                    epilog=exit_codes_help(EXIT_MEANINGS) + "\n\n" + ABOUT,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"exports {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    for module in COMMAND_MODULES:
        module.register(commands)
    for plugin in sorted(entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name):
        _register_plugin(commands, plugin)
    return parser


def _register_plugin(commands: argparse._SubParsersAction, plugin: EntryPoint) -> None:
    """A plugin that fails to load still leaves every other command working; its own command then
    answers with why, in one line."""
    try:
        plugin.load().register(commands)
    except Exception as exc:
        why = f"{type(exc).__name__}: {printable(str(exc), 200)}"
        p = command(commands, plugin.name, help_=f"(could not load: {why})", description=why, json_output=False)

        def broken(ctx: Context, args: argparse.Namespace) -> int:
            raise CliError(EXIT_FAILURE, f"exports {plugin.name} could not load ({plugin.value}): {why}")

        p.set_defaults(handler=broken)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
        if rest and not getattr(args, "forwards_unknown", False):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except UsageError as exc:
        # No handler, so no parsed --json: a script that asked for JSON on the command line gets it here too.
        usage(exc, json="--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv)
        return exc.code
    args.forwarded = rest
    try:
        settings = Settings.from_env()
    except Exception as exc:   # a ConfigError names the variable, and exits 2
        return _failed(None, exc, debug=False)
    ctx = Context(settings, json=getattr(args, "json", False))
    if not getattr(args, "long_running", False):
        # An operator script answers in one line; library log records would add lines of their own.
        if settings.debug:
            logs.configure(settings.log_format, level=logging.DEBUG)
        else:
            logging.getLogger().addHandler(logging.NullHandler())
    try:
        return args.handler(ctx, args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place an error becomes one line and its exit code, never a traceback
        return _failed(ctx, exc, debug=settings.debug)
    finally:
        ctx.close()


def _failed(ctx: Context | None, exc: Exception, *, debug: bool) -> int:
    """Says why in one line on stderr and answers the exit code. An expected answer's message speaks for
    itself; a surprise's (EXIT_FAILURE) is prefixed with its class, which tells what happened."""
    code = exit_code(exc)
    if isinstance(exc, CliError):
        error(ctx, code, exc.message, exc.data)
        return code
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if code == EXIT_FAILURE:
        if debug:
            log.exception("cli.unexpected_failure", error=type(exc).__name__)
        message = f"{type(exc).__name__}: {message}"
    error(ctx, code, printable(message, 300))
    return code


if __name__ == "__main__":
    sys.exit(main())
