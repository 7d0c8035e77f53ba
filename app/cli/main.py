"""``exports``: the operator scripts and the processes, one command.

Every subcommand has ``--help``, prints for people by default and one JSON document with ``--json``,
and ends with one of the named exit codes in ``app.cli.common`` (listed in every ``--help``). A bad
input is one line on stderr and its exit code, never a traceback, and changes nothing.

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
from app.cli import jobs, operations, processes, setup, views
from app.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_FAILURE,
    CliError,
    Context,
    Parser,
    command,
    printable,
)
from app.cli.output import error
from app.config import ConfigError, Settings

log = logging.getLogger("exports.cli")

#: The command modules, in the order ``exports --help`` lists their commands.
COMMAND_MODULES = (setup, jobs, views, operations, processes)
#: The entry point group through which installed packages add commands.
PLUGIN_GROUP = "exports.commands"


def build_parser() -> Parser:
    parser = Parser(prog="exports",
                    description="exports: queued CRM contact exports to partner SFTP servers, with safe "
                    "cancellation and recovery; the operator scripts and the processes.",
                    epilog=EXIT_CODES_HELP + "\n\nAn operator's write (--by) needs the operator's grant for the "
                    "tenant (exports operator grant),\nchecked before anything is written; setup commands (db, "
                    "tenant, destination, operator, contacts)\nare for administrators. Another tenant's export "
                    "answers exactly like a missing one.\n\nEXPORTS_DATABASE_URL picks the database; unset, an "
                    "embedded PostgreSQL runs under EXPORTS_STATE_DIR (default ./var).",
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
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "forwards_unknown", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.forwarded = rest
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        error(None, EXIT_BAD_INPUT, str(exc))
        return EXIT_BAD_INPUT
    ctx = Context(settings, json=getattr(args, "json", False))
    if not getattr(args, "long_running", False):
        # An operator script answers in one line; library log records would add lines of their own.
        if settings.debug:
            logs.configure(settings.log_format, level=logging.DEBUG)
        else:
            logging.getLogger().addHandler(logging.NullHandler())
    try:
        return args.handler(ctx, args)
    except CliError as exc:
        error(ctx, exc.code, exc.message, exc.data)
        return exc.code
    except ConfigError as exc:   # a setting that only this command needs (a broker for a relay, ...)
        error(ctx, EXIT_BAD_INPUT, str(exc))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place a surprise becomes one line instead of a traceback
        if settings.debug:
            log.exception("unexpected failure")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error(ctx, EXIT_FAILURE, f"{type(exc).__name__}: {printable(message, 300)}")
        return EXIT_FAILURE
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
