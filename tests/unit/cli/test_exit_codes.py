"""Each command's ``--help`` lists exactly the exit codes it can end with; ``exports --help`` lists them all;
only a command that takes ``--request-id`` tells the operator to retry with it; and the application's
errors map to exit codes through one table, most specific first.

What a handler can end with is read from its source: the ``EXIT_*`` codes it returns (or the result of one
of ours it returns), and the code of every ``CliError`` raised by it or by any function of the CLI (or of
the test equipment's commands) it calls, however deep.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable

import pytest

from app.cli import lookup as cli_lookup
from app.cli.common import (
    ERROR_EXITS,
    EVERY_COMMAND,
    EXIT_BAD_INPUT,
    EXIT_BUSY,
    EXIT_FAILURE,
    EXIT_MEANINGS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    CliError,
    Exit,
    Parser,
    busy,
    command,
    exit_code,
)
from app.cli.main import build_parser
from app.config import ConfigError
from app.delivery.errors import HostKeyMismatch
from app.errors import ExportsError
from app.store.errors import ChangedUnderLock
from tests.unit.cli.parsers import leaves

LEAVES = dict(leaves(build_parser()))
#: Codes a command returns from code the analysis does not read: dramatiq's command line, for the worker.
UNREAD = {("worker",): {3, 4}}
#: Where the analysis follows calls: the product's CLI and the test equipment's commands.
OURS = ("app.cli", "exports_devtools")
_CODE_LINE = re.compile(r"^  (\d+) +(\S.*)$")


def _listed(parser: argparse.ArgumentParser) -> dict[int, str]:
    """The codes the ``exit codes:`` block of a --help lists, each with its meaning (its lines joined)."""
    block = parser.format_help().split("exit codes:\n", 1)[1].split("\n\n", 1)[0]
    listed: dict[int, str] = {}
    for line in block.splitlines():
        match = _CODE_LINE.match(line)
        if match:
            code = int(match.group(1))
            listed[code] = match.group(2)
        else:
            listed[code] += " " + line.strip()
    return listed


def _source(func: Callable) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(func)))


def _scope(func: Callable) -> dict:
    """The names ``func`` sees: its module's, and those its body imports (a command that imports its
    implementation only when run, so registering it stays cheap)."""
    scope = dict(func.__globals__)
    for node in ast.walk(_source(func)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = importlib.import_module(node.module)
            for alias in node.names:
                found = getattr(module, alias.name, None)
                scope[alias.asname or alias.name] = found if found is not None else \
                    importlib.import_module(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                scope[alias.asname or alias.name.partition(".")[0]] = importlib.import_module(
                    alias.name if alias.asname else alias.name.partition(".")[0])
    return scope


def _resolve(node: ast.expr, scope: dict) -> object:
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        return getattr(base, node.attr, None) if inspect.ismodule(base) else None
    return None


def _ours(obj: object) -> bool:
    return inspect.isfunction(obj) and obj.__module__.startswith(OURS)


def _error_codes(call: ast.Call, scope: dict) -> set[int]:
    """The codes of the CliError a raise builds: ``CliError(EXIT_..., ...)``, or a call of one of ours
    that returns one (``not_found(...)``)."""
    callee = _resolve(call.func, scope)
    if callee is CliError:
        code = _resolve(call.args[0], scope)
        assert isinstance(code, int), f"cannot tell the code of {ast.unparse(call)}"
        return {code}
    if _ours(callee):
        return {code for node in ast.walk(_source(callee)) if isinstance(node, ast.Return)
                and isinstance(node.value, ast.Call) for code in _error_codes(node.value, _scope(callee))}
    return set()


def _raised(func: Callable, seen: set) -> set[int]:
    """The codes of every CliError ``func`` raises, or any of ours it calls raises."""
    if func in seen:
        return set()
    seen.add(func)
    codes: set[int] = set()
    scope = _scope(func)
    for node in ast.walk(_source(func)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            codes |= _error_codes(node.exc, scope)
        if isinstance(node, ast.Call) and _ours(callee := _resolve(node.func, scope)):
            codes |= _raised(callee, seen)
    return codes


def _returned(func: Callable) -> set[int]:
    """The EXIT_* codes ``func`` returns, and those of the functions of ours whose result it returns."""
    codes: set[int] = set()
    scope = _scope(func)
    for node in ast.walk(_source(func)):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        for name in ast.walk(node.value):
            if isinstance(name, ast.Name) and name.id.startswith("EXIT_"):
                codes.add(_resolve(name, scope))
        if isinstance(node.value, ast.Call) and _ours(callee := _resolve(node.value.func, scope)):
            codes |= _returned(callee)
    return codes


def _ends(handler: Callable) -> set[int]:
    """Every code the analysis finds ``handler`` can end a command with."""
    return _returned(handler) | _raised(handler, set())


# --- the help -------------------------------------------------------------------------------------


def test_exports_help_lists_the_whole_table():
    parser = build_parser()

    assert _listed(parser) == EXIT_MEANINGS
    assert "retry with the same --request-id" in parser.format_help()


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_each_command_help_lists_exactly_the_codes_it_declares_each_with_its_meaning(path):
    parser = LEAVES[path]

    assert parser.exits, "every command declares its exit codes (app.cli.common.command)"
    assert set(EVERY_COMMAND) <= set(parser.exits)
    assert _listed(parser) == parser.exits


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_a_command_without_a_request_id_never_mentions_one(path):
    parser = LEAVES[path]
    takes_one = any("--request-id" in action.option_strings for action in parser._actions)

    text = parser.format_help()

    assert ("--request-id" in text) is takes_one
    assert (EXIT_BUSY in parser.exits) is takes_one   # only a request id makes a busy answer safe to retry


def test_only_cancel_create_and_replace_take_a_request_id_so_only_their_help_says_retry():
    takers = {path for path, parser in LEAVES.items()
              if any("--request-id" in action.option_strings for action in parser._actions)}

    assert takers == {("cancel",), ("create",), ("replace",)}
    for taker in takers:
        assert "retry with the same --request-id" in _listed(LEAVES[taker])[EXIT_BUSY]


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_code_a_handler_can_end_with_is_in_its_help_and_no_other(path):
    parser = LEAVES[path]

    found = _ends(parser.get_default("handler"))

    assert found <= set(parser.exits), f"{' '.join(path)} can end with codes its --help does not list"
    beyond = set(parser.exits) - set(EVERY_COMMAND) - UNREAD.get(path, set())
    assert beyond <= found, f"{' '.join(path)} lists codes it never ends with"


# --- the analysis itself, on handlers of the test's own -----------------------------------------------


def _looks_up_then_is_busy(ctx, args):
    cli_lookup.tenant(ctx.views(), args.tenant)
    if args.locked:
        raise busy("locked")
    if args.taken:
        raise CliError(EXIT_REFUSED, "taken")
    return EXIT_OK if args.fine else EXIT_FAILURE


def test_the_analysis_follows_helpers_and_sees_every_code_a_handler_raises_or_returns():
    assert _ends(_looks_up_then_is_busy) == {EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_REFUSED,
                                             EXIT_BUSY}


def test_a_command_that_forgets_a_code_it_raises_is_caught():
    parser = Parser(prog="exports")
    p = command(parser.add_subparsers(parser_class=Parser), "probe", help_="", description="",
                exits=(EXIT_NOT_FOUND,))

    assert _ends(_looks_up_then_is_busy) - set(p.exits) == {EXIT_REFUSED, EXIT_BUSY}
    assert EXIT_BUSY not in _listed(p)


def test_a_code_can_mean_something_of_its_own_for_one_command():
    parser = Parser(prog="exports")
    p = command(parser.add_subparsers(parser_class=Parser), "probe", help_="", description="",
                exits=(Exit(EXIT_FAILURE, "a check failed"), EXIT_REFUSED))

    assert _listed(p) == {EXIT_OK: EXIT_MEANINGS[EXIT_OK], EXIT_FAILURE: "a check failed",
                          EXIT_BAD_INPUT: EXIT_MEANINGS[EXIT_BAD_INPUT], EXIT_REFUSED: EXIT_MEANINGS[EXIT_REFUSED]}


# --- the table --------------------------------------------------------------------------------------


@pytest.mark.parametrize("error, code", [
    (CliError(EXIT_REFUSED, "not granted"), EXIT_REFUSED),
    (CliError(EXIT_BUSY, "locked"), EXIT_BUSY),
    (ConfigError("EXPORTS_BROKER_URL is not set"), EXIT_BAD_INPUT),
    (ChangedUnderLock("export changed under its row lock"), EXIT_FAILURE),
    (HostKeyMismatch("another key"), EXIT_FAILURE),
    (RuntimeError("a bug"), EXIT_FAILURE),
    (KeyError("a bug"), EXIT_FAILURE),
])
def test_each_error_ends_a_command_with_its_exit_code(error, code):
    assert exit_code(error) == code


def test_the_table_lists_the_most_specific_error_first_so_no_row_is_shadowed():
    kinds = [kind for kind, _ in ERROR_EXITS]

    assert all(issubclass(kind, ExportsError) for kind in kinds)
    shadowed = [(later, earlier) for i, earlier in enumerate(kinds) for later in kinds[i + 1:]
                if issubclass(later, earlier)]
    assert shadowed == []
    assert kinds[-1] is ExportsError   # the application's every other error is said, in one line, as a failure


def test_the_table_ends_errors_only_with_codes_every_command_lists():
    # Any handler may meet any of the application's errors, and the analysis above follows only the CLI's
    # own: a row with a code of its own would need each command that can meet it to list that code.
    assert {code for _, code in ERROR_EXITS} <= set(EVERY_COMMAND)
