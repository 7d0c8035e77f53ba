"""The demo's own reads and writes, as the database owner: a lock that holds builds, a look at builds
waiting on it, and the removal of earlier demos' databases. Test equipment (app/devtools) only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from app.store import connector


def connect_owner(url: str) -> psycopg.Connection[dict]:
    """An autocommit connection as the URL's user, with no SET ROLE: the owner sees every session's
    activity and may drop databases."""
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


@contextmanager
def contacts_locked(url: str) -> Iterator[None]:
    """Holds the contacts table locked until the block ends, on a connection of its own."""
    with psycopg.connect(url, autocommit=False) as holder:
        connector.execute(holder, "devtools_lock_contacts")
        try:
            yield
        finally:
            holder.rollback()


def builds_waiting_on_lock(conn: psycopg.Connection) -> int:
    row = connector.fetch_one(conn, "devtools_builds_waiting_on_lock")
    return row["n"] if row else 0


def drop_earlier_demos(conn: psycopg.Connection, *, current: str) -> list[str]:
    """Drops every demo database but ``current`` (no demo may still use one) and returns their names."""
    names = [r["datname"] for r in connector.fetch_all(conn, "devtools_earlier_demo_databases", dict(current=current))]
    for name in names:
        # DROP DATABASE takes no parameters: the name goes in as an identifier.
        conn.execute(sql.SQL("/* devtools_drop_database */ DROP DATABASE IF EXISTS {} WITH (FORCE)")
                     .format(sql.Identifier(name)))
    return names
