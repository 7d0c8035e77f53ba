"""Connections under a role. Every process and every test connects through here, so each runs with
exactly the grants of its role and a missing or excess grant fails a test rather than production."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from app.store.types import Role

#: Seconds to wait for a connection before treating the database as unreachable.
CONNECT_TIMEOUT_SECONDS = 5


def connect(url: str, role: Role, *, autocommit: bool = True,
            application_name: str = "exports") -> psycopg.Connection[Any]:
    """A connection running as ``role``. Autocommit, because every protocol write is one statement and
    the few multi-statement writes open their own ``conn.transaction()``."""
    conn = psycopg.connect(
        url,
        autocommit=autocommit,
        row_factory=dict_row,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        application_name=application_name,
    )
    try:
        _set_role(conn, role)
    except BaseException:
        conn.close()
        raise
    return conn


def _set_role(conn: psycopg.Connection[Any], role: Role) -> None:
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role.value)))
    if not conn.autocommit:
        conn.commit()   # SET ROLE outlives the transaction only once committed


class Database:
    """A small pool of connections under one role. Dead connections are checked out of the pool before
    use (``check``), because after a server restart psycopg_pool would otherwise hand them out."""

    def __init__(self, url: str, role: Role, *, min_size: int = 1, max_size: int = 4, name: str = "exports"):
        self.url = url
        self.role = role
        self._pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                "application_name": name,
            },
            configure=lambda conn: _set_role(conn, role),
            check=ConnectionPool.check_connection,
            open=True,
            name=f"{name}-{role.value}",
        )

    @contextmanager
    def connection(self, timeout: float = CONNECT_TIMEOUT_SECONDS) -> Iterator[psycopg.Connection]:
        with self._pool.connection(timeout=timeout) as conn:
            yield conn

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
