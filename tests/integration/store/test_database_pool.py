"""The pool's check before use: a connection back from a checkout a moment ago is handed out again
without a round trip (a busy worker makes several checkouts per export), one idle for longer is checked,
so a connection a server restart killed (and a restart takes longer than the threshold) is replaced
rather than handed out."""

from __future__ import annotations

import time

from psycopg_pool import ConnectionPool

from app.store import database
from app.store.database import Database
from app.store.types import Role


def _backend(db: Database) -> int:
    with db.connection() as conn:
        return conn.info.backend_pid


def test_a_connection_returned_a_moment_ago_is_handed_out_again_without_a_check(db_url, monkeypatch):
    checks = []
    real = ConnectionPool.check_connection
    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(lambda conn: checks.append(1) or real(conn)))
    monkeypatch.setattr(database, "CHECK_AFTER_IDLE_SECONDS", 60.0)
    with Database(db_url, Role.APP, min_size=1, max_size=1) as db:
        first = _backend(db)
        checked_once = len(checks)
        assert [_backend(db) for _ in range(5)] == [first] * 5

    assert len(checks) == checked_once <= 1


def test_a_connection_idle_past_the_threshold_whose_backend_died_is_replaced_before_use(db_url, admin, monkeypatch):
    monkeypatch.setattr(database, "CHECK_AFTER_IDLE_SECONDS", 0.05)
    with Database(db_url, Role.APP, min_size=1, max_size=1) as db:
        dead = _backend(db)
        assert admin.execute("SELECT pg_terminate_backend(%s) AS t", (dead,)).fetchone()["t"]
        time.sleep(0.1)   # idle past the (shortened) threshold, as after a restart

        with db.connection() as conn:
            alive = conn.execute("SELECT pg_backend_pid() AS pid, current_user AS role").fetchone()

    assert alive["pid"] != dead and alive["role"] == Role.APP.value
