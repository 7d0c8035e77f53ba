"""Named SQL statements, loaded once from ``app/store/sql/*.sql``.

Each statement starts with ``-- name: <name>``; the comment lines after it say why it is shaped the
way it is. Parameters are psycopg's ``%(name)s`` placeholders, so no statement is ever built by
concatenation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

SQL_DIR = Path(__file__).with_name("sql")
_NAME = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)


def parse(text: str, *, origin: str = "<sql>") -> dict[str, str]:
    """Splits a file into ``{name: statement}``; the text before the first name is its preamble."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"{origin}: statement {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


def load(directory: Path = SQL_DIR) -> Mapping[str, str]:
    queries: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        for name, body in parse(path.read_text(encoding="utf-8"), origin=path.name).items():
            if name in queries:
                raise ValueError(f"{path.name}: statement {name!r} is defined in another file too")
            queries[name] = body
    return queries


QUERIES: Mapping[str, str] = load()
