"""What every ``exports`` subcommand shares: the exit codes and the one table that maps the application's
errors to them, the one-line error, argument types that refuse hostile input before it reaches the
database, the parsers' common shape (each leaf's ``--help`` lists the exit codes it can return), and the
context that resolves the database (the one place a command starts the embedded one)."""

from __future__ import annotations

import argparse
import getpass
import re
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple
from uuid import UUID

import psycopg

from app.config import ConfigError, DatabaseUrls, Settings, configured_database
from app.errors import ExportsError
from app.store.database import connect
from app.store.types import Role, Status
from app.store.views import Views

#: Done (for cancel, every recorded cancellation outcome: TooLate and AlreadyEnded are answers, not errors).
EXIT_OK = 0
#: Something unexpected (the database unreachable, a bug); the one-line message says what.
EXIT_FAILURE = 1
#: Bad input: a malformed id, an unknown status, a hostile or oversized string, a bad CSV row, a setting.
EXIT_BAD_INPUT = 2
#: Not found: no such job, tenant or destination. Another tenant's job answers exactly like a missing one.
EXIT_NOT_FOUND = 3
#: Refused or conflict: not granted for the tenant, NotChanged, RequestIdReused, replacement not
#: allowed or its slot taken, a reconciliation or correction that matched nothing.
EXIT_REFUSED = 4
#: Unavailable (sysexits' EX_UNAVAILABLE), one code for two answers that mean the same to a script, "what
#: this depends on is not there": a partner's server could not be reached to check a credential
#: (EXIT_UNREACHABLE), or a health check failed (EXIT_UNHEALTHY, so a probe tells "the deployment is not
#: doing its job" from "the check itself crashed", 1).
EXIT_UNREACHABLE = EXIT_UNHEALTHY = 69
#: Busy: the job's row was locked past the lock timeout; nothing was recorded. Retry with the same request id.
EXIT_BUSY = 75
#: Login refused (sysexits' EX_NOPERM): a partner's server refused the credential or presented a key not pinned.
EXIT_LOGIN_REFUSED = 77

#: What each exit code means, as ``exports --help`` lists them all and each command's ``--help`` its own.
EXIT_MEANINGS = {
    EXIT_OK: "done",
    EXIT_FAILURE: "unexpected failure (database unreachable, ...)",
    EXIT_BAD_INPUT: "bad input (malformed id, unknown status, hostile or oversized text, a bad EXPORTS_* setting)",
    EXIT_NOT_FOUND: "not found (another tenant's job looks exactly like a missing one)",
    EXIT_REFUSED: "refused or conflict (operator not granted for the tenant, NotChanged, RequestIdReused, "
                  "replacement not allowed or slot taken)",
    EXIT_UNREACHABLE: "unavailable: a partner's server could not be reached to check a credential, or (exports "
                      "health) a health check failed, each failed one saying why",
    EXIT_BUSY: "busy: nothing recorded; retry with the same --request-id",
    EXIT_LOGIN_REFUSED: "login refused: a partner's server refused the credential or presented a host key not pinned",
}
#: What done means for cancel, whose every recorded outcome is an answer rather than an error.
CANCEL_DONE = "done (every recorded cancellation outcome included: TooLate and AlreadyEnded are answers)"
#: The codes every command can end with: done, a surprise, and bad input (a usage error, which argparse
#: refuses before the handler runs, or an EXPORTS_* setting we cannot use).
EVERY_COMMAND = (EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT)

#: Longest accepted name (tenants, destinations, operators), matching the schema's CHECKs.
MAX_NAME = 200
#: Longest accepted free text (reasons, evidence, host key lines, paths).
MAX_TEXT = 2000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class CliError(ExportsError):
    """Raised when a command ends with a one-line answer and the exit code it carries (``bad_input``,
    ``not_found``, ``refused``, ``busy``); nothing more is printed, and ``data`` joins the line with --json."""

    def __init__(self, code: int, message: str, **data: object):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def bad_input(message: str, **data: object) -> CliError:
    return CliError(EXIT_BAD_INPUT, message, **data)


def not_found(message: str, **data: object) -> CliError:
    return CliError(EXIT_NOT_FOUND, message, **data)


def refused(message: str, **data: object) -> CliError:
    return CliError(EXIT_REFUSED, message, **data)


def busy(message: str, **data: object) -> CliError:
    return CliError(EXIT_BUSY, message, **data)


#: The exit code each of the application's other errors ends a command with, most specific first: the
#: first class the error is an instance of wins. A CliError carries its own code; an error outside the
#: tree (a library's, a bug) is EXIT_FAILURE. The store answers with values, not errors, so what a write
#: matched maps to a code in its handler, deliberately.
ERROR_EXITS: tuple[tuple[type[ExportsError], int], ...] = (
    # A setting this command needs (a broker for a relay, the reconciler's login...) is the operator's input.
    (ConfigError, EXIT_BAD_INPUT),
    # An impossible row count (StoreError), an unusable destination...: unexpected, said in one line.
    (ExportsError, EXIT_FAILURE),
)


def exit_code(exc: BaseException) -> int:
    """The code ``exc`` ends a command with (see ``ERROR_EXITS``)."""
    if isinstance(exc, CliError):
        return exc.code
    return next((code for kind, code in ERROR_EXITS if isinstance(exc, kind)), EXIT_FAILURE)


class Exit(NamedTuple):
    """An exit code with what it means for one command, where that is not ``EXIT_MEANINGS``'s."""

    code: int
    meaning: str


def exit_meanings(exits: Iterable[int | Exit]) -> dict[int, str]:
    """``EVERY_COMMAND``'s codes and ``exits``, each with its meaning, in code order."""
    meanings = {code: EXIT_MEANINGS[code] for code in EVERY_COMMAND}
    for code in exits:
        if isinstance(code, Exit):
            meanings[code.code] = code.meaning
        else:
            meanings[code] = EXIT_MEANINGS[code]
    return dict(sorted(meanings.items()))


def exit_codes_help(meanings: Mapping[int, str]) -> str:
    """The ``exit codes:`` block of a ``--help``."""
    lines = ["exit codes:"]
    lines += [textwrap.fill(meaning, width=100, initial_indent=f"  {code:<4}", subsequent_indent=" " * 6)
              for code, meaning in meanings.items()]
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a ``UsageError`` (one line on stderr and exit code 2, never the usage
    block). A command's parser knows the exit codes its ``--help`` lists (``command``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: The exit codes this command can end with, and what each means (``command`` sets them).
        self.exits: dict[int, str] = {}

    def error(self, message: str) -> None:   # type: ignore[override]
        # Raised rather than printed, so main answers it like any other bad input: one line, or with
        # --json on the command line one JSON document.
        raise UsageError(f"{self.prog}: error: {printable(message)}")


class UsageError(CliError):
    """Raised when the command line itself is wrong (argparse's usage errors): bad input, said in one line
    that names the command, before any handler runs."""

    def __init__(self, message: str):
        super().__init__(EXIT_BAD_INPUT, message)


def printable(text: str, limit: int = 300) -> str:
    """Text safe for one terminal line: control characters and undecodable bytes escaped, long text cut."""
    cleaned = text.encode("utf-8", "backslashreplace").decode("utf-8")
    cleaned = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", cleaned).replace("\n", "\\n").replace("\t", "\\t")
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + f"... ({len(cleaned)} chars)"



def text(max_length: int = MAX_TEXT, *, allow_empty: bool = False):
    """An argparse type for free text: valid UTF-8, no control characters, bounded length."""

    def parse(value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise argparse.ArgumentTypeError("not valid UTF-8") from None
        if _CONTROL.search(value) or "\n" in value:
            raise argparse.ArgumentTypeError("control characters are not allowed")
        if len(value) > max_length:
            raise argparse.ArgumentTypeError(f"too long ({len(value)} characters; at most {max_length})")
        if not allow_empty and not value.strip():
            raise argparse.ArgumentTypeError("must not be empty")
        return value

    parse.__name__ = "text"
    return parse


name = text(MAX_NAME)


def operator_name(by: str | None) -> str:
    """Who does an administrator's change, for its record: ``--by``, else this login's name."""
    if by:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):   # no login name: a container's numeric user
        return "unknown"


def uuid_arg(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {printable(value, 60)!r}") from None


uuid_arg.__name__ = "UUID"


def status_arg(value: str) -> Status:
    for status in Status:
        if value.lower() == status.value.lower():
            return status
    raise argparse.ArgumentTypeError(
        f"unknown status {printable(value, 60)!r}; one of: {', '.join(s.value for s in Status)}")


status_arg.__name__ = "status"


def positive_int(maximum: int):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {printable(value, 60)!r}") from None
        if not 1 <= number <= maximum:
            raise argparse.ArgumentTypeError(f"must be between 1 and {maximum}")
        return number

    parse.__name__ = "number"
    return parse


def time_arg(value: str) -> datetime:
    """An ISO 8601 time (``2026-12-01``, ``2026-12-01T08:00``, ``...+01:00``, ``...Z``); without an offset, UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {printable(value, 60)!r}") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


time_arg.__name__ = "time"


def seconds_arg(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {printable(value, 60)!r}") from None
    if not 0.001 <= number <= 3600:
        raise argparse.ArgumentTypeError("must be between 0.001 and 3600 seconds")
    return number


seconds_arg.__name__ = "seconds"


def command(subparsers: argparse._SubParsersAction, name_: str, *, help_: str, description: str,
            exits: Iterable[int | Exit] = (), json_output: bool = True) -> Parser:
    """A command that runs a handler: ``--json`` where it prints a document, and at the end of its
    ``--help`` the exit codes it can end with: ``EVERY_COMMAND``'s and ``exits`` (an ``Exit`` where a
    code means something of its own for this command)."""
    parents = []
    if json_output:
        json_option = argparse.ArgumentParser(add_help=False)
        json_option.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        parents.append(json_option)
    meanings = exit_meanings(exits)
    parser: Parser = subparsers.add_parser(name_, help=help_, description=description, parents=parents,
                                           epilog=exit_codes_help(meanings),
                                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.exits = meanings
    return parser


def job_command(subparsers: argparse._SubParsersAction, name_: str, help_: str, description: str,
                exits: Iterable[int | Exit] = ()) -> Parser:
    """A command about one export: its id, and the tenant it must belong to (so it can answer not found)."""
    p = command(subparsers, name_, help_=help_, description=description, exits=(EXIT_NOT_FOUND, *exits))
    p.add_argument("job", type=uuid_arg, metavar="JOB", help="the export's id")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    return p


def group(subparsers: argparse._SubParsersAction, name_: str, help_: str) -> argparse._SubParsersAction:
    """A command whose actions are commands of their own (``exports db migrate``)."""
    parser = subparsers.add_parser(name_, help=help_, description=help_)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    actions.required = True
    return actions


@dataclass
class Context:
    """Per invocation: the settings (read once, by ``main``), the output mode, the database's logins
    resolved once, and the read-only views opened on first use (``close`` releases them)."""

    settings: Settings
    json: bool = False
    _database: DatabaseUrls | None = field(default=None, repr=False)
    _views: Views | None = field(default=None, repr=False)

    def database(self) -> DatabaseUrls:
        """The configured database's logins; with none configured, the embedded PostgreSQL's, started
        (or joined) here, on a command's first use of the database, and never for a command that does
        not use it."""
        if self._database is None:
            self._database = configured_database(self.settings)
        if self._database is None:
            from app import embedded

            self._database = embedded.start(self.settings)
        return self._database

    def database_url(self) -> str:
        """The application's login."""
        return self.database().app

    @contextmanager
    def connection(self, role: Role = Role.APP) -> Iterator[psycopg.Connection]:
        """A connection as ``role``; a correction's (exports_reconciler) uses the reconciler's own login."""
        url = self.database().reconciler if role is Role.RECONCILER else self.database_url()
        conn = connect(url, role, application_name="exports-cli")
        try:
            yield conn
        finally:
            conn.close()

    def views(self) -> Views:
        """The operator's reads, as the application role, read-only."""
        if self._views is None:
            self._views = Views(self.database_url(), Role.APP)
        return self._views

    def close(self) -> None:
        if self._views is not None:
            self._views.close()
