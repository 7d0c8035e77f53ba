"""Permissions: history is append-only and the outbox insert-only apart from published_at, by the
database's grants for the roles and by triggers that stop even the owner."""

from __future__ import annotations

import uuid

import pytest
from psycopg import errors as pg

from app.store import cancellation
from app.store import relay as relay_store
from app.store.types import Role
from tests.factories_more import catalog_database

HISTORY = ["export_attempt_events", "cancellation_requests", "deliveries"]
#: A harmless change per table, for the statements that must be refused.
CHANGE = {
    "export_attempt_events": "detail = 'rewritten'",
    "cancellation_requests": "reason = 'rewritten'",
    "deliveries": "delivery_key = delivery_key || '-rewritten'",
    "outbox": "published_at = clock_timestamp()",
}


@pytest.fixture(scope="module")
def catalog(pg_server_url, template_db):
    """The grants never change under a test, so the catalog checks share one database."""
    with catalog_database(pg_server_url, template_db) as conn:
        yield conn


@pytest.fixture
def history(seed):
    """One row in each history table and the outbox: a claimed job with a recorded stop request."""
    job = seed.running()
    result = cancellation.request_cancellation(seed.conn, tenant_id=job.tenant_id, job_id=job.id,
                                               request_id=uuid.uuid4(), requested_by="ops-bob")
    assert result.outcome is not None
    return job


def _snapshot(admin, table: str) -> list[dict]:
    return admin.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()


def _privilege(admin, role: Role, table: str, privilege: str) -> bool:
    return admin.execute("SELECT has_table_privilege(%s, %s, %s) AS ok",
                         (role.value, table, privilege)).fetchone()["ok"]


def _any_column_privilege(admin, role: Role, table: str, privilege: str) -> bool:
    return admin.execute("SELECT has_any_column_privilege(%s, %s, %s) AS ok",
                         (role.value, table, privilege)).fetchone()["ok"]


def _columns(admin, table: str) -> list[str]:
    rows = admin.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = 'public'"
                         " AND table_name = %s ORDER BY ordinal_position", (table,)).fetchall()
    return [r["column_name"] for r in rows]


# --- the application role --------------------------------------------------------------------------


@pytest.mark.parametrize("table", HISTORY)
@pytest.mark.parametrize("privilege", ["UPDATE", "DELETE", "TRUNCATE"])
def test_the_application_role_holds_no_privilege_to_change_history(catalog, table, privilege):
    assert not _privilege(catalog, Role.APP, table, privilege)
    # Column grants would not show in has_table_privilege.
    if privilege == "UPDATE":
        assert not _any_column_privilege(catalog, Role.APP, table, privilege)


@pytest.mark.parametrize("table", HISTORY)
@pytest.mark.parametrize("statement", ["UPDATE {table} SET {change}", "DELETE FROM {table}"])
def test_the_application_role_is_refused_when_it_tries_to_change_history(history, admin, conn, table, statement):
    before = _snapshot(admin, table)
    assert before

    with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
        conn.execute(statement.format(table=table, change=CHANGE[table]))

    assert _snapshot(admin, table) == before


def test_the_application_role_is_not_a_reconciliation_operator(catalog):
    for privilege in ("MEMBER", "USAGE"):
        assert not catalog.execute("SELECT pg_has_role('exports_app', 'exports_reconciler', %s) AS ok",
                                 (privilege,)).fetchone()["ok"]


def test_the_dispatcher_is_not_a_reconciliation_operator_or_an_application(catalog):
    for role in ("exports_reconciler", "exports_app"):
        assert not catalog.execute("SELECT pg_has_role('exports_dispatcher', %s, 'MEMBER') AS ok",
                                 (role,)).fetchone()["ok"]


# --- the dispatcher --------------------------------------------------------------------------------


def test_the_dispatcher_may_update_only_published_at_in_the_outbox(catalog):
    columns = _columns(catalog, "outbox")
    assert "published_at" in columns

    updatable = [c for c in columns if catalog.execute(
        "SELECT has_column_privilege('exports_dispatcher', 'outbox', %s, 'UPDATE') AS ok", (c,)).fetchone()["ok"]]

    assert updatable == ["published_at"]


def test_the_dispatcher_marks_a_row_published_through_the_relay_statement(history, admin, connect_as):
    dispatcher = connect_as(Role.DISPATCHER)
    [row] = admin.execute("SELECT message_id FROM outbox WHERE published_at IS NULL").fetchall()

    assert relay_store.mark_published(dispatcher, message_ids=[row["message_id"]]) == 1

    assert admin.execute("SELECT published_at FROM outbox WHERE message_id = %s",
                         (row["message_id"],)).fetchone()["published_at"] is not None


@pytest.mark.parametrize("column", ["kind", "job_id", "created_at", "message_id", "due_at"])
def test_the_dispatcher_is_refused_when_it_tries_to_update_another_outbox_column(history, admin, connect_as, column):
    dispatcher = connect_as(Role.DISPATCHER)
    before = _snapshot(admin, "outbox")

    with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
        dispatcher.execute(f"UPDATE outbox SET {column} = {column}")

    assert _snapshot(admin, "outbox") == before


@pytest.mark.parametrize("privilege", ["INSERT", "DELETE", "TRUNCATE"])
def test_the_dispatcher_holds_no_privilege_to_add_or_remove_outbox_rows(catalog, privilege):
    assert not _privilege(catalog, Role.DISPATCHER, "outbox", privilege)


def test_the_dispatcher_is_refused_when_it_tries_to_insert_an_outbox_row(history, admin, connect_as):
    dispatcher = connect_as(Role.DISPATCHER)

    with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
        dispatcher.execute("INSERT INTO outbox (message_id, kind, job_id, created_at)"
                           " VALUES (gen_random_uuid(), 'ExportReady', %s, clock_timestamp())", (history.id,))

    assert len(_snapshot(admin, "outbox")) == 1


def test_the_dispatcher_is_refused_when_it_tries_to_delete_an_outbox_row(history, admin, connect_as):
    dispatcher = connect_as(Role.DISPATCHER)

    with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
        dispatcher.execute("DELETE FROM outbox")

    assert len(_snapshot(admin, "outbox")) == 1


def test_the_dispatcher_reads_a_jobs_id_and_tenant_for_its_log_line_and_nothing_else_of_it(history, admin, connect_as):
    dispatcher = connect_as(Role.DISPATCHER)
    assert not _privilege(admin, Role.DISPATCHER, "export_jobs", "SELECT")
    readable = {r["attname"] for r in admin.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'export_jobs'::regclass AND attnum > 0 "
        "AND NOT attisdropped AND has_column_privilege('exports_dispatcher', 'export_jobs', attname, 'SELECT')")}
    assert readable == {"id", "tenant_id"}
    for privilege in ("INSERT", "UPDATE", "REFERENCES"):
        assert not _any_column_privilege(admin, Role.DISPATCHER, "export_jobs", privilege)

    dispatcher.execute("SELECT id, tenant_id FROM export_jobs").fetchall()
    with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
        dispatcher.execute("SELECT status FROM export_jobs")


# --- the outbox: nobody deletes ----------------------------------------------------------------------


@pytest.mark.parametrize("role", [r for r in Role if r is not Role.RETENTION], ids=lambda r: r.value)
def test_no_role_but_retention_holds_delete_on_the_outbox(catalog, role):
    assert not _privilege(catalog, role, "outbox", "DELETE")
    assert not _privilege(catalog, role, "outbox", "TRUNCATE")


def test_the_retention_role_may_read_and_delete_outbox_rows_and_nothing_more(catalog):
    assert _privilege(catalog, Role.RETENTION, "outbox", "DELETE")
    assert not _privilege(catalog, Role.RETENTION, "outbox", "TRUNCATE")
    assert not _privilege(catalog, Role.RETENTION, "outbox", "INSERT")
    assert not any(_privilege(catalog, Role.RETENTION, table, "SELECT")
                   for table in ("export_jobs", "export_attempt_events", "cancellation_requests"))


# --- heartbeats: only the scheduler's role prunes -----------------------------------------------------


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
def test_only_the_application_role_may_delete_heartbeats_and_no_role_may_truncate_them(catalog, role):
    # The scheduler prunes the processes dead for long (heartbeat_prune) as exports_app; the relay beats
    # as exports_dispatcher and must not remove another process's record.
    assert _privilege(catalog, role, "process_heartbeats", "DELETE") is (role is Role.APP)
    assert not _privilege(catalog, role, "process_heartbeats", "TRUNCATE")


# --- the triggers stop even the owner ----------------------------------------------------------------


@pytest.mark.parametrize("table", HISTORY + ["outbox"])
@pytest.mark.parametrize("statement", ["DELETE FROM {table}", "TRUNCATE {table} CASCADE"])
def test_the_owner_cannot_delete_or_truncate_history_or_the_outbox(history, admin, table, statement):
    before = _snapshot(admin, table)
    assert before

    # deliveries is referenced by export_jobs, so a plain TRUNCATE would stop at the foreign key before
    # any trigger; CASCADE reaches the triggers, and the named table's fires first.
    with pytest.raises(pg.InsufficientPrivilege, match=f"on {table} is not allowed"):
        admin.execute(statement.format(table=table))

    assert _snapshot(admin, table) == before


@pytest.mark.parametrize("table", HISTORY)
def test_the_owner_cannot_update_history(history, admin, table):
    before = _snapshot(admin, table)

    with pytest.raises(pg.InsufficientPrivilege, match=f"UPDATE on {table} is not allowed"):
        admin.execute(f"UPDATE {table} SET {CHANGE[table]}")

    assert _snapshot(admin, table) == before


@pytest.mark.parametrize("change", ["kind = 'Other'", "job_id = gen_random_uuid()",
                                    "created_at = created_at - interval '1 day'",
                                    "message_id = gen_random_uuid()",
                                    "due_at = clock_timestamp() - interval '1 day'"])
def test_the_owner_cannot_update_an_outbox_column_other_than_published_at(history, admin, change):
    before = _snapshot(admin, "outbox")

    with pytest.raises(pg.InsufficientPrivilege, match="only published_at may change"):
        admin.execute(f"UPDATE outbox SET {change}")

    assert _snapshot(admin, "outbox") == before


def test_the_owner_may_still_set_published_at(history, admin):
    changed = admin.execute("UPDATE outbox SET published_at = clock_timestamp() WHERE published_at IS NULL").rowcount

    assert changed == 1
