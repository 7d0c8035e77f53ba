"""The demo's and the chaos soak's own reads and writes, as the database owner: a lock that holds
builds, a look at builds waiting on it, the owner of an attempt, the ending of sessions (the workers',
or all of a database's), and the removal of earlier demos' and soaks' databases. Test equipment
(devtools/exports_devtools) only."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from exports_devtools.store import queries


def connect_owner(url: str) -> psycopg.Connection[dict]:
    """An autocommit connection as the URL's user, with no SET ROLE: the owner sees every session's
    activity and may drop databases."""
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


@contextmanager
def contacts_locked(url: str) -> Iterator[None]:
    """Holds the contacts table locked until the block ends, on a connection of its own."""
    with psycopg.connect(url, autocommit=False) as holder:
        queries.execute(holder, "owner_lock_contacts")
        try:
            yield
        finally:
            holder.rollback()


def builds_waiting_on_lock(conn: psycopg.Connection) -> int:
    row = queries.fetch_one(conn, "owner_builds_waiting_on_lock")
    return row["n"] if row else 0


def drop_earlier_demos(conn: psycopg.Connection, *, current: str) -> list[str]:
    """Drops every demo database but ``current`` (no demo may still use one) and returns their names."""
    names = [r["datname"] for r in queries.fetch_all(conn, "owner_earlier_demo_databases", dict(current=current))]
    for name in names:
        drop_database(conn, name)
    return names


def attempt_owner(conn: psycopg.Connection[Any], attempt_id: UUID) -> dict[str, Any] | None:
    """``{job_id, claimed_by, status}`` of the job whose current attempt is ``attempt_id``, or None."""
    return queries.fetch_one(conn, "owner_attempt_owner", dict(attempt_id=attempt_id))


def terminate_sessions(conn: psycopg.Connection[Any], application_names: Iterable[str]) -> int:
    """Ends this database's sessions opened under ``application_names``; returns how many were ended."""
    rows = queries.fetch_all(conn, "owner_terminate_sessions", dict(names=list(application_names)))
    return sum(1 for r in rows if r["terminated"])


def terminate_database(conn: psycopg.Connection[Any]) -> int:
    """Ends every other client session of this database; returns how many were ended."""
    return sum(1 for r in queries.fetch_all(conn, "owner_terminate_database") if r["terminated"])



def drop_database(conn: psycopg.Connection[Any], name: str) -> None:
    """Drops ``name``, ending its sessions first."""
    # DROP DATABASE takes no parameters: the name goes in as an identifier.
    conn.execute(sql.SQL("/* owner_drop_database */ DROP DATABASE IF EXISTS {} WITH (FORCE)")
                 .format(sql.Identifier(name)))


def grant_connect(conn: psycopg.Connection[Any], database: str, login: str) -> None:
    """Lets ``login`` connect to ``database`` (a configured server may revoke it from PUBLIC)."""
    conn.execute(sql.SQL("/* owner_grant_connect */ GRANT CONNECT ON DATABASE {} TO {}")
                 .format(sql.Identifier(database), sql.Identifier(login)))
