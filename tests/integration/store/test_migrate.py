"""``exports db migrate`` brings any earlier database to this release's schema once, and the scans the
scheduler and the operator views run are index scans whatever the size of the history."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from app.store import connector, migrate
from tests.conftest import _CATALOG_FINGERPRINT


@pytest.fixture
def empty_db(pg_server_url):
    name = f"exports_m_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as server:
        server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_conninfo(pg_server_url, dbname=name)
    with psycopg.connect(pg_server_url, autocommit=True) as server:
        server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _fingerprint(url: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute(_CATALOG_FINGERPRINT).fetchone()[0]


def test_a_new_database_is_migrated_to_the_latest_version_and_a_second_run_changes_nothing(empty_db):
    assert migrate.migrate(empty_db) is True
    assert migrate.migrate(empty_db) is False

    with psycopg.connect(empty_db) as conn:
        assert migrate.current_version(conn) == migrate.SCHEMA_VERSION > 1


def test_a_database_at_the_first_version_is_upgraded_to_the_same_schema_as_a_new_one(empty_db, db_url):
    first, *later = migrate.steps()
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(first.text())
        assert migrate.current_version(conn) == 1

    assert migrate.migrate(empty_db) is True

    assert _fingerprint(empty_db) == _fingerprint(db_url)
    with psycopg.connect(empty_db) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == [step.version for step in [first, *later]]


def test_the_steps_run_from_one_without_gaps():
    assert [s.version for s in migrate.steps()] == list(range(1, migrate.SCHEMA_VERSION + 1))


# --- scans stay index scans ----------------------------------------------------------------------------

JOBS = 20_000


@pytest.fixture
def history(admin):
    """JOBS jobs of one tenant, most finished, a few waiting or running, as the owner (a bulk insert the
    statements cannot make), then analysed."""
    tenant, destination = uuid.uuid4(), uuid.uuid4()
    admin.execute("INSERT INTO tenants (id, name) VALUES (%s, 'history')", (tenant,))
    admin.execute("INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir, host_key,"
                  " credential_ref) VALUES (%s, %s, 'd', 'h', 22, 'u', '/in', 'h ssh-ed25519 AAAA', 'env:X')",
                  (destination, tenant))
    with admin.transaction():
        admin.execute("""
            INSERT INTO deliveries (tenant_id, delivery_key, original_job_id)
            SELECT %(tenant)s, 'k' || n, md5('job' || n)::uuid FROM generate_series(1, %(jobs)s) AS n""",
                      dict(tenant=tenant, jobs=JOBS))
        admin.execute("""
            INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by,
                                     woken_at, attempt_id, attempt_count, lease_expires_at)
            SELECT md5('job' || n)::uuid, %(tenant)s,
                   CASE WHEN n %% 1000 = 0 THEN 'Queued' WHEN n %% 1000 = 1 THEN 'Running'
                        WHEN n %% 1000 = 2 THEN 'OutcomeUnknown' ELSE 'Completed' END,
                   1, %(destination)s, 'k' || n, 'history', clock_timestamp(),
                   CASE WHEN n %% 1000 IN (1, 2) OR n %% 1000 > 2 THEN gen_random_uuid() END,
                   CASE WHEN n %% 1000 = 0 THEN 0 ELSE 1 END,
                   CASE WHEN n %% 1000 = 1 THEN clock_timestamp() + interval '1 minute' END
            FROM generate_series(1, %(jobs)s) AS n""", dict(tenant=tenant, destination=destination, jobs=JOBS))
        admin.execute("""
            INSERT INTO outbox (message_id, kind, job_id, created_at, published_at)
            SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), clock_timestamp() FROM export_jobs""")
        admin.execute("""
            INSERT INTO export_attempt_events (job_id, attempt_id, kind, detail, recorded_at)
            SELECT id, attempt_id, kind, '{}', clock_timestamp()
            FROM export_jobs, unnest(ARRAY['Claimed', 'DeliveryEvidence', 'DeliveryEvidence']) AS kind
            WHERE attempt_id IS NOT NULL""")
    admin.execute("ANALYZE")
    return tenant


def _plan(conn: psycopg.Connection, name: str, params: dict) -> dict:
    cursor = psycopg.ClientCursor(conn)   # binds client-side, so EXPLAIN sees the values
    cursor.execute("EXPLAIN (FORMAT JSON) " + connector.text(name), params)
    return cursor.fetchone()["QUERY PLAN"][0]["Plan"]


def _scans(plan: dict) -> list[tuple[str, str | None, str | None]]:
    """(node, relation, index) for every node; an index scan without an index condition (a walk of the
    whole index, filtering every row) is reported as ``<index> (no condition)``."""
    index = plan.get("Index Name")
    if index and "Index Cond" not in plan:
        index += " (no condition)"
    found = [(plan["Node Type"], plan.get("Relation Name"), index)]
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


SCANS = [
    ("recovery_scan_expired", dict(batch_size=100), "ix_export_jobs_lease"),
    ("sweeper_republish_due", dict(sweep_after_seconds=1800, batch_size=500), "ix_export_jobs_woken"),
    # The first page has no bound on id: it walks the partial index from its start (which holds only
    # these jobs), or reads them by status from (status, created_at); either touches no other job.
    ("recovery_scan_outcome_unknown", dict(after=None, batch_size=200),
     ("ix_export_jobs_outcome_unknown (no condition)", "ix_export_jobs_status_created")),
    ("recovery_read_evidence", dict(job_id=uuid.uuid4(), attempt_id=uuid.uuid4()), "ix_export_attempt_events_attempt"),
    # Due wake-ups only, oldest due first; deferrals' rows wait in the same partial index.
    ("relay_claim_batch", dict(batch_size=200), "ix_outbox_unpublished"),
    # Recent proven non-deliveries only, however many exports ever completed.
    ("retries_scan_due", dict(created_by="retry-policy", backoff_seconds=60, window_seconds=86400, batch_size=100),
     "ix_export_jobs_not_delivered"),
]


def test_every_scheduler_scan_reads_its_index_and_never_the_whole_table(history, admin):
    wrong = {}
    for statement, params, index in SCANS:
        scans = _scans(_plan(admin, statement, params))
        allowed = index if isinstance(index, tuple) else (index,)
        if not any(name in allowed for _, _, name in scans) or any(
                node == "Seq Scan" and relation == "export_jobs" for node, relation, _ in scans):
            wrong[statement] = scans

    assert wrong == {}
