"""One error tree: every exception class the product defines derives from ``app.errors.ExportsError`` and
says when it is raised, and the tree drawn at the top of app/errors.py is the tree the code defines,
each class under its parent and in the file it names.

Read from the sources, not by importing every module (the worker's module installs a broker on import).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from pathlib import Path

import app.errors

ROOT = Path(app.errors.__file__).parent.parent
_TREE_LINE = re.compile(r"^(?P<indent> *)(?P<name>[A-Z]\w+)(?: \((?P<also>\w+)\))?(?:\s+(?P<path>app/\S+\.py))?")


@dataclass(frozen=True)
class Defined:
    path: str
    bases: tuple[str, ...]
    doc: str


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ast.unparse(node)


def _classes() -> dict[str, list[Defined]]:
    """Every class the product defines, by name (a name may be defined in several modules)."""
    found: dict[str, list[Defined]] = {}
    for file in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(Defined(
                    str(file.relative_to(ROOT)), tuple(map(_base_name, node.bases)), ast.get_docstring(node) or ""))
    return found


def _is_exception(defined: Defined, classes: dict[str, list[Defined]]) -> bool:
    for base in defined.bases:
        if base in classes:
            if any(_is_exception(other, classes) for other in classes[base]):
                return True
        elif isinstance(builtin := getattr(builtins, base, None), type) and issubclass(builtin, BaseException):
            return True
    return False


CLASSES = _classes()
#: The product's exception classes, by name; an error's name is its own (checked below).
ERRORS = {name: defined for name, definitions in CLASSES.items() for defined in definitions
          if _is_exception(defined, CLASSES)}


def _ancestors(name: str) -> set[str]:
    bases = ERRORS[name].bases if name in ERRORS else ()
    return set(bases).union(*(_ancestors(base) for base in bases))


def _drawn() -> dict[str, tuple[str | None, str, str | None]]:
    """The tree in app/errors.py's docstring: each class's parent, its file and its second base."""
    text = app.errors.__doc__ or ""
    block = text.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    drawn: dict[str, tuple[str | None, str, str | None]] = {}
    stack: list[tuple[int, str, str]] = []   # (indent, name, path) of the lines above, shallower first
    for line in block.splitlines():
        match = _TREE_LINE.match(line)
        if match is None:
            continue   # a continuation of the line above's description
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent, parent_path = (stack[-1][1], stack[-1][2]) if stack else (None, "")
        path = match.group("path") or parent_path
        drawn[match.group("name")] = (parent, path, match.group("also"))
        stack.append((indent, match.group("name"), path))
    return drawn


def test_each_error_name_is_defined_once():
    twice = sorted(name for name in ERRORS if sum(_is_exception(d, CLASSES) for d in CLASSES[name]) > 1)

    assert twice == []


def test_the_product_defines_its_errors_and_the_tree_has_them_all():
    assert {"ExportsError", "ConfigError", "StoreError", "DestinationError", "BuildError", "ClaimUnknown",
            "EvidenceNotAppended", "CliError"} <= set(ERRORS)


def test_every_error_the_product_defines_derives_from_exports_error():
    outside = sorted(name for name in ERRORS if name != "ExportsError" and "ExportsError" not in _ancestors(name))

    assert outside == []


def test_every_error_says_when_it_is_raised():
    silent = sorted(f"{name} ({defined.path})" for name, defined in ERRORS.items()
                    if name != "ExportsError" and not defined.doc.startswith("Raised when"))

    assert silent == []


def test_the_tree_at_the_top_of_app_errors_is_the_tree_the_code_defines():
    drawn = _drawn()

    assert set(drawn) == set(ERRORS)
    for name, (parent, path, also) in drawn.items():
        defined = ERRORS[name]
        assert path == defined.path, f"{name} is defined in {defined.path}, not {path}"
        assert parent is None or parent in defined.bases, f"{name} derives from {defined.bases}, not {parent}"
        assert also is None or also in defined.bases, f"{name} is not also a {also}"


def test_app_errors_is_the_bottom_layer_and_imports_nothing():
    tree = ast.parse(Path(app.errors.__file__).read_text())

    assert [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))] == []
