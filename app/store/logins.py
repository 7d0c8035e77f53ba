"""One login per kind of process, so the database, not convention, keeps corrections to reconciliation
operators.

- the application login (workers, relay, scheduler, notifier, operator scripts) is a member of
  ``exports_app``, ``exports_dispatcher`` and ``exports_notifier`` and of nothing else: it cannot
  ``SET ROLE exports_reconciler``;
- the reconciler login (``exports correct``, ``EXPORTS_RECONCILER_DATABASE_URL``) is a member of
  ``exports_reconciler`` only.

``exports db logins`` prints these statements (or applies them with ``--apply``) as the owner. They
set no password: the DBA gives each login the authentication its ``pg_hba.conf`` asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from psycopg import errors as pg
from psycopg import sql

from app.store.types import Role

T = TypeVar("T")

#: The catalog's unique indexes that two sessions creating the same role, or granting the same
#: membership, at once collide on.
_ROLE_INDEXES = ("pg_authid_rolname_index", "pg_auth_members_role_member_index")

#: The default names of the two logins.
APP_LOGIN = "exports_app_login"
RECONCILER_LOGIN = "exports_reconciler_login"


@dataclass(frozen=True)
class Logins:
    app: str = APP_LOGIN
    reconciler: str = RECONCILER_LOGIN

    def memberships(self) -> dict[str, tuple[Role, ...]]:
        return {self.app: (Role.APP, Role.DISPATCHER, Role.NOTIFIER), self.reconciler: (Role.RECONCILER,)}


def statements(logins: Logins = Logins()) -> list[sql.Composed]:
    """Idempotent: a login that exists keeps its password and attributes, and gains its memberships."""
    out: list[sql.Composed] = []
    for login, roles in logins.memberships().items():
        out.append(sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN "
            "CREATE ROLE {login} LOGIN NOINHERIT; END IF; END $$").format(
                name=sql.Literal(login), login=sql.Identifier(login)))
        out.append(sql.SQL("GRANT {roles} TO {login}").format(
            roles=sql.SQL(", ").join(sql.Identifier(r.value) for r in roles), login=sql.Identifier(login)))
    return out


def script(conn: psycopg.Connection, logins: Logins = Logins()) -> str:
    """The statements as one SQL script, for a DBA to read and run."""
    return ";\n".join(s.as_string(conn) for s in statements(logins)) + ";\n"


def apply(admin_url: str, logins: Logins = Logins()) -> None:
    def run() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn, conn.transaction():
            for statement in statements(logins):
                conn.execute(statement)

    once_more_after_role_race(run)


def once_more_after_role_race(run: Callable[[], T]) -> T:
    """Runs a transaction that creates roles or memberships if missing, a second time when it lost a
    race to another doing the same. Roles belong to the cluster, so two databases of one cluster
    migrated at once (or two ``--apply`` runs) can both find a role missing; the later CREATE ROLE
    then waits for the earlier to commit and fails on the catalog's unique index. Its transaction
    rolled back, having changed nothing, and its second run finds the role."""
    try:
        return run()
    except pg.UniqueViolation as exc:
        if exc.diag.constraint_name not in _ROLE_INDEXES:
            raise
        return run()
