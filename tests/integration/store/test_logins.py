"""One login per kind of process: the application's login cannot correct an outcome, even with SET ROLE;
the reconciler's can."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from app.store import export, logins
from app.store.database import connect
from app.store.types import Role, Status
from exports_devtools.waiting import wait_until
from tests.support import Background, wait_until_blocked


@pytest.fixture(scope="module")
def login_names(pg_server_url):
    names = logins.Logins()
    logins.apply(pg_server_url, names)
    return names


def _as(db_url: str, login: str) -> str:
    return make_conninfo(db_url, user=login)


def _grant_connect(admin, login: str) -> None:
    admin.execute(f'GRANT CONNECT ON DATABASE "{admin.info.dbname}" TO "{login}"')


def test_the_application_login_cannot_become_the_reconciler(login_names, db_url, admin):
    _grant_connect(admin, login_names.app)
    with connect(_as(db_url, login_names.app), Role.APP) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET ROLE exports_reconciler")


def test_the_application_login_cannot_correct_a_recorded_outcome(login_names, db_url, admin, seed):
    job = seed.finished(Status.COMPLETED)
    _grant_connect(admin, login_names.app)
    with connect(_as(db_url, login_names.app), Role.APP) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            export.correct(conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=job.attempt_id,
                           recorded_status=Status.COMPLETED, corrected_status=Status.FAILED,
                           failure_reason=None, evidence_ref="t-1", why="test", corrected_by="mallory")
    assert seed.status(job) is Status.COMPLETED


def test_the_reconciler_login_corrects_once(login_names, db_url, admin, seed):
    from app.store.types import FailureCode

    job = seed.finished(Status.COMPLETED)
    _grant_connect(admin, login_names.reconciler)
    with connect(_as(db_url, login_names.reconciler), Role.RECONCILER) as conn:
        assert export.correct(conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=job.attempt_id,
                              recorded_status=Status.COMPLETED, corrected_status=Status.FAILED,
                              failure_reason=FailureCode.NOT_DELIVERED, evidence_ref="t-1", why="partner lost it",
                              corrected_by="rita")
    assert seed.status(job) is Status.FAILED


def test_the_reconciler_login_cannot_run_the_application(login_names, db_url, admin):
    _grant_connect(admin, login_names.reconciler)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        connect(_as(db_url, login_names.reconciler), Role.APP)


def test_the_script_is_idempotent_and_names_each_membership(login_names, pg_server_url, admin):
    logins.apply(pg_server_url, login_names)   # a second time: no error, nothing new
    text = logins.script(admin, login_names)

    assert 'GRANT "exports_app", "exports_dispatcher", "exports_notifier" TO "exports_app_login"' in text
    assert 'GRANT "exports_reconciler" TO "exports_reconciler_login"' in text


def test_a_role_created_by_another_session_meanwhile_is_found_when_the_transaction_runs_again(pg_server_url, admin):
    # Two databases of one cluster migrated at once: each migrator's advisory lock is its database's own.
    name = f"exports_race_{uuid.uuid4().hex[:8]}"
    create = sql.SQL("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN "
                     "CREATE ROLE {role} NOLOGIN; END IF; END $$").format(name=sql.Literal(name),
                                                                       role=sql.Identifier(name))
    backends: list[int] = []

    def run() -> None:
        with psycopg.connect(pg_server_url, autocommit=True) as conn, conn.transaction():
            backends.append(conn.info.backend_pid)
            conn.execute(create)

    try:
        with psycopg.connect(pg_server_url) as earlier:
            earlier.execute(create)   # uncommitted: the later CREATE ROLE waits on its index entry
            later = Background(lambda: logins.once_more_after_role_race(run))
            wait_until(lambda: backends, "the later transaction to start")
            wait_until_blocked(admin, backends[0], by=earlier)
            earlier.commit()
        later.result()

        assert len(backends) == 2   # the first run lost the race, the second found the role
        assert admin.execute("SELECT count(*) AS n FROM pg_roles WHERE rolname = %s", (name,)).fetchone()["n"] == 1
    finally:
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
