"""``exports db migrate``: brings a database to this release's schema, once, under an advisory lock.

``schema.sql`` (at the top of the repository, shipped in the wheel as ``app/store/schema.sql``) is the
current schema, and records the version it is. A new database gets it in one step. A database made by an
earlier release is brought to it by the numbered files in ``app/store/migrations/``: ``0001_initial.sql``
is the first release's schema, and each later file (``0002_indexes_for_views_and_scans.sql``...) one
change, applied in order after the version the database records, each in the same transaction as the
``schema_version`` row that records it. A database at the latest version is left alone, so a second run
is a no-op; one at a version this release does not know is refused; two migrators serialize on the lock.
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

from app.errors import ExportsError
from app.store import logins

#: Any constant shared by all migrators; two concurrent runs serialize on it.
_LOCK_KEY = 0x6578706F  # "expo"
_MIGRATION = re.compile(r"^(?P<version>\d{4})_[a-z0-9_]+\.sql$")


class SchemaTooNew(ExportsError):
    """Raised when the database records a schema version newer than this release knows: a later
    release migrated it, and this one must not run against it (nor write an older schema over it)."""


@dataclass(frozen=True)
class Step:
    version: int
    name: str
    source: Traversable

    def text(self) -> str:
        return self.source.read_text(encoding="utf-8")


def steps() -> list[Step]:
    """Every migration this release knows, in order, from ``0001_initial.sql`` (the first release's schema)."""
    found = []
    for entry in (resources.files("app.store") / "migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Step(int(match["version"]), entry.name, entry))
    found.sort(key=lambda s: s.version)
    versions = [s.version for s in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must run 1, 2, 3... without gaps or repeats, not {versions}")
    return found


#: The schema version this release runs against: the last migration's, which schema.sql records.
SCHEMA_VERSION = len(steps())


def schema() -> Step:
    """``schema.sql``: the whole current schema, as one step from an empty database."""
    return Step(SCHEMA_VERSION, "schema.sql", resources.files("app.store") / "schema.sql")


def migrate(url: str) -> bool:
    """Applies what the database lacks; True when something was applied, False when it was up to date.
    Raises SchemaTooNew, changing nothing, for a database at a version newer than this release's.
    The roles are the cluster's, the lock only this database's: see ``logins.once_more_after_role_race``."""
    return logins.once_more_after_role_race(lambda: _migrate(url))


def _migrate(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            current = current_version(conn)
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(f"the database is at schema version {current}, newer than this release's "
                                   f"{SCHEMA_VERSION}: run the release that migrated it, or a later one")
            if current == 0:
                step = schema()
                conn.execute(step.text())   # records its own version
                recorded = current_version(conn)
                if recorded != SCHEMA_VERSION:
                    raise RuntimeError(f"schema.sql records version {recorded}, but the last migration is "
                                       f"{SCHEMA_VERSION}: the two must change together")
                return True
            pending = [step for step in steps() if step.version > current]
            for step in pending:
                conn.execute(step.text())
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
