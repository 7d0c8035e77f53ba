"""The one way the application sends SQL: a named statement, with verbs that say how many rows come back.

Every statement goes to the server as ``/* <name> */ <text>``, so ``pg_stat_statements``, the server's
logs and the lost-response proxy (test equipment's ``pgproxy``) all see which statement ran. Connections
come from ``app.store.database`` with ``dict_row`` rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import psycopg
from psycopg import sql

from app.store.statements import STATEMENTS

Params = Mapping[str, Any] | None


class Catalog:
    """A set of named statements and the verbs that run them. The product has one (``PRODUCT``, from
    ``app/store/sql``); test equipment builds its own from its own files, so its statements never load
    into a production process."""

    def __init__(self, statements: Mapping[str, str]):
        self.statements = statements

    def text(self, name: str) -> str:
        """The statement as the server receives it. Raises KeyError for an unknown name."""
        return f"/* {name} */ {self.statements[name]}"

    def execute(self, conn: psycopg.Connection[Any], name: str, params: Params = None) -> int:
        """Runs a statement; returns how many rows it changed (or returned)."""
        return conn.execute(self.text(name), params).rowcount

    def fetch_one(self, conn: psycopg.Connection[Any], name: str, params: Params = None) -> dict[str, Any] | None:
        """The first row, or None. Connections from app.store.database make dict rows."""
        return cast("dict[str, Any] | None", conn.execute(self.text(name), params).fetchone())

    def fetch_all(self, conn: psycopg.Connection[Any], name: str, params: Params = None) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", conn.execute(self.text(name), params).fetchall())

    @contextmanager
    def copy(self, conn: psycopg.Connection, name: str, params: Params = None,
             parts: Mapping[str, sql.Composable] | None = None) -> Iterator[psycopg.Copy]:
        """A ``COPY ... FROM STDIN`` or ``TO STDOUT`` statement, open for writing or reading rows. COPY
        binds no parameters server-side, so what a statement leaves open (``{columns}``) is ``parts``:
        identifiers and literals composed by psycopg, never text."""
        query: str | sql.Composed = self.text(name) if parts is None else sql.SQL(self.text(name)).format(**parts)
        with conn.cursor() as cur, cur.copy(query, params) as copied:
            yield copied


PRODUCT = Catalog(STATEMENTS)
text = PRODUCT.text
execute = PRODUCT.execute
fetch_one = PRODUCT.fetch_one
fetch_all = PRODUCT.fetch_all
copy = PRODUCT.copy


def set_config(conn: psycopg.Connection, setting: str, value: str, *, local: bool) -> None:
    """``SET [LOCAL]`` with a bound value (SET itself takes no parameters)."""
    conn.execute("/* set_config */ SELECT set_config(%s, %s, %s)", (setting, value, local))


def listen(conn: psycopg.Connection, channel: str) -> None:
    conn.execute(sql.SQL("/* listen */ LISTEN {}").format(sql.Identifier(channel)))


def reset(conn: psycopg.Connection, setting: str) -> None:
    conn.execute(sql.SQL("/* reset */ RESET {}").format(sql.Identifier(setting)))
