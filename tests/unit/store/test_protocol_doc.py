"""docs/protocol.md's transition table and the code stay in step: every statement it names exists and is
run by the function the row names, in the store module the statement's name starts with, and every
statement that changes a job's state has a row."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from app.store.statements import STATEMENTS

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
_ROW = re.compile(r"^\| (?P<from>[^|]+) \| (?P<to>[^|]+) \| `(?P<statement>[a-z_]+)`[^|]* \| (?P<functions>[^|]+) \|",
                  re.MULTILINE)
_FUNCTION = re.compile(r"`(?P<module>[a-z_]+)\.(?P<name>[a-z_]+)`")


def rows() -> list[re.Match]:
    return list(_ROW.finditer(DOC.read_text(encoding="utf-8")))


def _source_with_helpers(module, function) -> str:
    """The function's source and that of the module's own functions it calls (one level): a transaction
    such as a cancellation runs its statements in a private helper."""
    source = inspect.getsource(function)
    called = set(re.findall(r"\b(\w+)\(", source))
    helpers = [getattr(module, name) for name in called if inspect.isfunction(getattr(module, name, None))]
    return source + "".join(inspect.getsource(h) for h in helpers if h.__module__ == module.__name__)


def test_every_row_names_a_statement_that_exists():
    assert rows()
    assert sorted({r["statement"] for r in rows()} - set(STATEMENTS)) == []


def test_every_row_names_the_store_function_that_runs_its_statement():
    wrong = []
    for row in rows():
        module_name = row["statement"].split("_")[0]
        first = _FUNCTION.search(row["functions"])
        if first is None or first["module"] != module_name:
            wrong.append(f"{row['statement']}: {row['functions'].strip()}")
            continue
        module = importlib.import_module(f"app.store.{module_name}")
        function = getattr(module, first["name"], None)
        if function is None or f'"{row["statement"]}"' not in _source_with_helpers(module, function):
            wrong.append(f"{row['statement']}: {first['module']}.{first['name']} does not run it")
    assert wrong == []


def test_every_statement_that_changes_an_export_the_outbox_or_a_webhook_delivery_has_a_row():
    documented = {r["statement"] for r in rows()}
    changing = {name for name, text in STATEMENTS.items()
                if re.search(r"\b(UPDATE export_jobs|INSERT INTO export_jobs|UPDATE outbox|UPDATE webhook_deliveries"
                             r"|INSERT INTO webhook_deliveries)\b", text)}

    assert sorted(changing - documented) == []
