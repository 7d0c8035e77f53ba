"""Mapping checks: what the Python side assumes about the schema is compared with the schema itself,
so a new column or a new status fails here rather than in the cancel path or an alert.

That every Failed carries a failure code, and nothing else carries one, is proven against
ck_export_jobs_failure in test_reconciliation.py (directly and through the correction statement).
"""

from __future__ import annotations

import re

import pytest

from app.store import connector, export
from app.store.models import ExportJob
from app.store.statements import STATEMENTS
from app.store.types import CancellationOutcome, EditResult, EventKind, FailureCode, Status
from tests.factories_more import catalog_database

_SET_CLAUSE = re.compile(r"\bUPDATE\s+export_jobs\b.*?\bSET\b(?P<set>.*?)\bWHERE\b", re.DOTALL | re.IGNORECASE)


@pytest.fixture(scope="module")
def catalog(pg_server_url, template_db):
    """The schema never changes under a test, so the catalog checks share one database."""
    with catalog_database(pg_server_url, template_db) as conn:
        yield conn


def _table_columns(admin, table: str) -> list[str]:
    rows = admin.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = 'public'"
                         " AND table_name = %s ORDER BY ordinal_position", (table,)).fetchall()
    return [r["column_name"] for r in rows]


def _check_values(admin, table: str, column: str) -> list[str]:
    """The values a single-column CHECK constraint allows, parsed from pg_get_constraintdef."""
    rows = admin.execute("""
        SELECT pg_get_constraintdef(c.oid) AS definition
        FROM pg_constraint c
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
        WHERE c.contype = 'c' AND c.conrelid = %s::regclass AND cardinality(c.conkey) = 1 AND a.attname = %s
    """, (table, column)).fetchall()
    assert len(rows) == 1, f"expected one CHECK on {table}.{column}, found {rows}"
    values = re.findall(r"'((?:[^']|'')*)'::text", rows[0]["definition"])
    assert values, rows[0]["definition"]
    return values


def _set_clauses() -> list[tuple[str, str]]:
    return [(name, m.group("set")) for name, text in STATEMENTS.items() for m in _SET_CLAUSE.finditer(text)]


def test_the_cancellation_lock_selects_the_models_fields_in_order(seed, conn):
    job = seed.queued()

    with conn.transaction():
        cursor = conn.execute(connector.text("cancellation_lock_job"), dict(job_id=job.id, tenant_id=job.tenant_id))
        selected = [column.name for column in cursor.description]
        assert cursor.fetchone()["id"] == job.id

    assert selected == [field.column_name for field in ExportJob._meta.sorted_fields]


def test_the_export_job_model_maps_every_column_of_the_table_in_order(catalog):
    assert [field.column_name for field in ExportJob._meta.sorted_fields] == _table_columns(catalog, "export_jobs")


@pytest.mark.parametrize(("table", "column", "enum"), [
    ("export_jobs", "status", Status),
    ("export_attempt_events", "kind", EventKind),
    ("export_jobs", "failure_reason", FailureCode),
    ("cancellation_requests", "outcome", CancellationOutcome),
    ("cancellation_requests", "found_status", Status),
], ids=["Status", "EventKind", "FailureCode", "CancellationOutcome", "FoundStatus"])
def test_each_enum_has_exactly_the_values_its_check_constraint_allows(catalog, table, column, enum):
    allowed = _check_values(catalog, table, column)

    assert len(allowed) == len(set(allowed))
    assert sorted(allowed) == sorted(member.value for member in enum)


def test_the_terms_edit_sets_woken_at_with_the_database_clock_and_increments_version_in_its_text():
    [(_, assignments)] = [(n, s) for n, s in _set_clauses() if n == "export_edit_terms"]

    assert re.search(r"\bwoken_at\s*=\s*clock_timestamp\(\)", assignments)
    assert re.search(r"\bversion\s*=\s*version\s*\+\s*1\b", assignments)


#: The one wake-up set in the future: a deferral's, due after its backoff, still on the database's clock.
DEFERRED_WAKEUP = ("export_defer", "clock_timestamp() + make_interval(secs => %(delay_seconds)s)")


def test_no_statement_sets_woken_at_from_a_client_parameter():
    woken = [(name, m.group(1)) for name, text in STATEMENTS.items()
             for m in re.finditer(r"\bwoken_at\s*=\s*([^,\n]+)", text)]

    assert woken, "no statement sets woken_at: the sweeper would never see a wake-up"
    assert all(value.strip() == "clock_timestamp()" or (name, value.strip()) == DEFERRED_WAKEUP
               for name, value in woken), woken
    assert DEFERRED_WAKEUP in [(name, value.strip()) for name, value in woken]


def test_every_write_to_a_terms_column_increments_version():
    terms_writes = [(name, s) for name, s in _set_clauses() if re.search(r"\bdestination_id\s*=", s)]

    assert [name for name, _ in terms_writes] == ["export_edit_terms"]
    assert all(re.search(r"\bversion\s*=\s*version\s*\+\s*1\b", s) for _, s in terms_writes)


def test_running_the_terms_edit_moves_woken_at_to_the_servers_clock_and_increments_version(seed, admin, conn):
    job = seed.queued()
    new_destination = seed.destination(job.tenant_id)
    seed.age_wakeup(job, minutes=60)

    before = admin.execute("SELECT clock_timestamp() AS t").fetchone()["t"]
    outcome = export.edit_terms(conn, tenant_id=job.tenant_id, job_id=job.id, expected_version=1,
                              destination_id=new_destination)
    after = admin.execute("SELECT clock_timestamp() AS t").fetchone()["t"]

    assert (outcome.result, outcome.version) == (EditResult.CHANGED, 2)
    row = seed.row(job)
    assert (row["version"], row["destination_id"]) == (2, new_destination)
    assert before <= row["woken_at"] <= after
    wakeups = seed.outbox(job)
    assert len(wakeups) == 2 and len({w["message_id"] for w in wakeups}) == 2


def test_a_terms_edit_for_a_stale_version_changes_nothing(seed, conn):
    job = seed.queued()
    before = seed.row(job)

    outcome = export.edit_terms(conn, tenant_id=job.tenant_id, job_id=job.id, expected_version=2,
                              destination_id=seed.destination(job.tenant_id))

    assert outcome.result is EditResult.NOT_CHANGED
    assert seed.row(job) == before
    assert len(seed.outbox(job)) == 1

