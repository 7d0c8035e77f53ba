"""``exports db migrate``: applies schema.sql once, under an advisory lock, as the database owner."""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import errors as pg
from psycopg import sql

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schema.sql"
SCHEMA_VERSION = 1
#: Any constant shared by all migrators; two concurrent runs serialize on it.
_LOCK_KEY = 0x6578706F  # "expo"


def migrate(url: str, *, schema_path: Path = SCHEMA_PATH) -> bool:
    """Returns True when the schema was applied, False when it already was (a second run is a no-op)."""
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            if _applied(conn):
                return False
            conn.execute(schema_path.read_text(encoding="utf-8"))
            return True


def _applied(conn: psycopg.Connection) -> bool:
    if conn.execute("SELECT to_regclass('public.schema_version') IS NOT NULL").fetchone()[0] is False:
        return False
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return row[0] is not None and row[0] >= SCHEMA_VERSION


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
