"""Named SQL statements, loaded once from ``app/store/sql/<module>.sql``.

Each statement starts with ``-- name: <module>_<verb>``: the prefix is the file's name, which is also
the name of the ``app/store/<module>.py`` that runs it, so a statement's name says where it lives and
who runs it. The comment lines after the name say why it is shaped the way it is. Parameters are
psycopg's ``%(name)s`` placeholders, so no statement is ever built by concatenation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

SQL_DIR = Path(__file__).with_name("sql")
_NAME = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)


def parse(text: str, *, origin: str = "<sql>") -> dict[str, str]:
    """Splits a file into ``{name: statement}``; the text before the first name is its preamble."""
    parts = _NAME.split(text)
    statements: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in statements:
            raise ValueError(f"{origin}: statement {name!r} is defined twice")
        statements[name] = body.strip()
    return statements


def load(directory: Path = SQL_DIR) -> Mapping[str, str]:
    statements: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        for name, body in parse(path.read_text(encoding="utf-8"), origin=path.name).items():
            if not name.startswith(path.stem + "_"):
                raise ValueError(f"{path.name}: statement {name!r} must be named {path.stem}_...")
            statements[name] = body
    return statements


STATEMENTS: Mapping[str, str] = load()
