"""``exports db migrate``: brings a database to this release's schema, once, under an advisory lock.

``schema.sql`` (at the top of the repository, shipped in the wheel as ``app/store/schema.sql``) is the
first version: the reference design's tables, ours, the roles, grants and triggers. Each later change
is a numbered file in ``app/store/migrations/`` (``0002_operator_views.sql``...), applied in order,
each in the same transaction as the ``schema_version`` row that records it. A database at the latest
version is left alone, so a second run is a no-op, and two migrators serialize on the lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import psycopg
from psycopg import errors as pg
from psycopg import sql
from psycopg.rows import tuple_row

#: Any constant shared by all migrators; two concurrent runs serialize on it.
_LOCK_KEY = 0x6578706F  # "expo"
_MIGRATION = re.compile(r"^(?P<version>\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Step:
    version: int
    name: str
    source: Traversable

    def text(self) -> str:
        return self.source.read_text(encoding="utf-8")


def steps() -> list[Step]:
    """Every version this release knows, in order: the schema file, then the migrations."""
    package = resources.files("app.store")
    found = [Step(1, "schema.sql", package / "schema.sql")]
    for entry in (package / "migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Step(int(match["version"]), entry.name, entry))
    found.sort(key=lambda s: s.version)
    versions = [s.version for s in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must run 1, 2, 3... without gaps or repeats, not {versions}")
    return found


#: The schema version this release runs against.
SCHEMA_VERSION = len(steps())


def migrate(url: str) -> bool:
    """Applies every step the database lacks; True when one was applied, False when it was up to date."""
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            current = current_version(conn)
            pending = [step for step in steps() if step.version > current]
            for step in pending:
                conn.execute(step.text())
                if step.version > 1:   # schema.sql records version 1 itself
                    conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (step.version,))
            return bool(pending)


def current_version(conn: psycopg.Connection[Any]) -> int:
    """The highest version recorded, 0 for a database that has never been migrated."""
    cur = conn.cursor(row_factory=tuple_row)   # whatever rows the connection makes
    missing = cur.execute("SELECT to_regclass('public.schema_version') IS NULL").fetchone()
    if missing is None or missing[0]:
        return 0
    row = cur.execute("SELECT max(version) FROM schema_version").fetchone()
    return (row[0] if row else None) or 0


def create_database(admin_url: str, name: str) -> bool:
    """Creates database ``name`` on the server of ``admin_url`` unless it exists; True when it did."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except pg.DuplicateDatabase:
            return False   # another process created it first
        return True
