"""Connections under a role. Every process and every test connects through here, so each runs with
exactly the grants of its role and a missing or excess grant fails a test rather than production."""

from __future__ import annotations

import threading
import time
import weakref
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
#: Seconds a pooled connection may have been idle and still be handed out without a round trip to check
#: it. A server restart takes longer than this (shutdown, then recovery at start-up), so a connection
#: the restart killed has been idle longer and is checked; a busy worker's checkouts, several per
#: export, skip the check (a round trip and a transaction each).
CHECK_AFTER_IDLE_SECONDS = 1.0


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


class _IdleChecks:
    """psycopg_pool's ``check`` for connections idle longer than ``CHECK_AFTER_IDLE_SECONDS``, and the
    record of when each went back to the pool. The record is taken as the checkout ends, not by the
    pool's ``reset``: psycopg_pool runs a reset on one of its worker threads, a hand-off per return
    (a queue, a condition, a thread woken) that cost a worker process about 6% of its CPU."""

    def __init__(self) -> None:
        self._returned: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def check(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            returned = self._returned.pop(conn, None)
        if returned is None or time.monotonic() - returned >= CHECK_AFTER_IDLE_SECONDS:
            ConnectionPool.check_connection(conn)

    def returned(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            self._returned[conn] = time.monotonic()


class Database:
    """A small pool of connections under one role. Connections idle for a while are checked before use
    (``check``), because after a server restart psycopg_pool would otherwise hand out dead ones."""

    def __init__(self, url: str, role: Role, *, min_size: int = 1, max_size: int = 4, name: str = "exports"):
        self.url = url
        self.role = role
        self._checks = checks = _IdleChecks()
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
            check=checks.check,
            open=True,
            name=f"{name}-{role.value}",
        )

    @contextmanager
    def connection(self, timeout: float = CONNECT_TIMEOUT_SECONDS) -> Iterator[psycopg.Connection]:
        with self._pool.connection(timeout=timeout) as conn:
            try:
                yield conn
            finally:
                self._checks.returned(conn)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
