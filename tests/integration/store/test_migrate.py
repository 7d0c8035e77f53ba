"""``exports db migrate`` gives a new database ``schema.sql`` in one step and brings any earlier database,
from the first release's schema on, to the same schema through the numbered migrations; it refuses a
database newer than this release. And the scans the scheduler and the operator views run are index scans
whatever the size of the history."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from app.store import connector, migrate
from tests.factories import DEFAULT_PROFILE_ROW
from tests.support import unavailable

#: Lines a dump of the same schema may differ by. pg_dump 15.14, 16.10 and 17.6 and later open and close
#: a dump with ``\restrict KEY`` / ``\unrestrict KEY`` (psql refuses meta-commands in between), and KEY
#: is random on every run unless given; nothing else in a schema-only dump depends on the database.
_RANDOM_PER_DUMP = re.compile(r"^\\(un)?restrict \S+$", re.MULTILINE)
_CREATE_ROLE = re.compile(r"CREATE ROLE (\w+)")

#: Every privilege held on an object of the database, by grantee, from the catalog rather than a dump:
#: tables, sequences and views, their columns, functions, the schema, and default privileges.
_PRIVILEGES = """
WITH acl (kind, object, item) AS (
    SELECT 'relation', c.relname::text, aclexplode(c.relacl) FROM pg_class c
    WHERE c.relnamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'column', c.relname || '.' || a.attname, aclexplode(a.attacl) FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'function', p.oid::regprocedure::text, aclexplode(p.proacl) FROM pg_proc p
    WHERE p.pronamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'schema', n.nspname::text, aclexplode(n.nspacl) FROM pg_namespace n WHERE n.nspname = 'public'
    UNION ALL
    SELECT 'default ' || d.defaclobjtype::text, coalesce(d.defaclnamespace::regnamespace::text, '*'),
           aclexplode(d.defaclacl) FROM pg_default_acl d)
SELECT kind, object,
       CASE WHEN (item).grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid((item).grantee) END AS grantee,
       (item).privilege_type, (item).is_grantable
FROM acl ORDER BY 1, 2, 3, 4, 5
"""


def _create(server_url: str) -> str:
    name = f"exports_m_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as server:
        server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def _drop(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as server:
        server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def empty_db(pg_server_url):
    name = _create(pg_server_url)
    yield make_conninfo(pg_server_url, dbname=name)
    _drop(pg_server_url, name)


@pytest.fixture(scope="module")
def new_db(pg_server_url):
    """A database given schema.sql by ``migrate``, as a new installation is; its schema never changes
    under a test, so the module's tests share it."""
    name = _create(pg_server_url)
    url = make_conninfo(pg_server_url, dbname=name)
    assert migrate.migrate(url) is True
    yield url
    _drop(pg_server_url, name)


@pytest.fixture(scope="module")
def pg_dump(pg_server_url) -> Path:
    """A pg_dump of the server's major version: an older one refuses a newer server, and a newer one
    writes a dump of its own dialect. The server's own bin directory first (the embedded server's is in
    the pgserver package), then the usual places."""
    with psycopg.connect(pg_server_url) as conn:
        major = conn.info.server_version // 10000
        bindir = conn.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'").fetchone()[0]
    candidates = [Path(bindir) / "pg_dump"]
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin" / "pg_dump")
    candidates.append(Path(f"/usr/lib/postgresql/{major}/bin/pg_dump"))
    on_path = shutil.which("pg_dump")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file():
            version = subprocess.run([candidate, "--version"], capture_output=True, text=True, check=True).stdout
            found = re.search(r"\) (\d+)", version)
            if found and int(found[1]) == major:
                return candidate
    unavailable(f"no pg_dump of PostgreSQL {major}, the server's version, among {', '.join(map(str, candidates))}")


def _dump(pg_dump: Path, url: str) -> str:
    done = subprocess.run([pg_dump, "--schema-only", "--dbname", url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return _RANDOM_PER_DUMP.sub("", done.stdout)


def _privileges(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(_PRIVILEGES).fetchall()


def _versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]


def _at_version(url: str, version: int) -> None:
    """The database as the release that ran migration ``version`` left it: 0001, then each later one with
    the row that records it."""
    with psycopg.connect(url, autocommit=True) as conn:
        for step in migrate.steps()[:version]:
            with conn.transaction():
                conn.execute(step.text())
                if step.version > 1:   # 0001, the first release's schema.sql, records itself
                    conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (step.version,))
        assert migrate.current_version(conn) == version


def test_a_new_database_gets_the_schema_file_in_one_step_and_a_second_run_changes_nothing(empty_db):
    assert migrate.migrate(empty_db) is True
    assert migrate.migrate(empty_db) is False

    assert migrate.SCHEMA_VERSION > 1
    assert _versions(empty_db) == [migrate.SCHEMA_VERSION]


@pytest.mark.parametrize("version", range(1, migrate.SCHEMA_VERSION))
def test_a_database_at_an_earlier_version_is_upgraded_to_the_same_schema_as_a_new_one(
        empty_db, new_db, pg_dump, version):
    _at_version(empty_db, version)

    assert migrate.migrate(empty_db) is True
    assert migrate.migrate(empty_db) is False

    assert _versions(empty_db) == list(range(1, migrate.SCHEMA_VERSION + 1))
    upgraded, new = _dump(pg_dump, empty_db), _dump(pg_dump, new_db)
    assert "CREATE TABLE public.process_heartbeats" in new   # a dump of the whole schema, not of nothing
    assert upgraded == new


def test_a_database_upgraded_from_the_first_version_grants_every_role_what_a_new_one_does(empty_db, new_db):
    _at_version(empty_db, 1)
    migrate.migrate(empty_db)

    new = _privileges(new_db)
    # Every role holds something; roles themselves are the cluster's, shared by both databases.
    assert {"exports_app", "exports_dispatcher", "exports_reconciler", "exports_retention"} <= {r[2] for r in new}
    assert _privileges(empty_db) == new


def test_the_schema_file_creates_every_role_the_migrations_create():
    # Roles are the cluster's: both databases of the tests above see every role whichever file created it,
    # so a role only the migrations create would go unnoticed there and be missing from a new cluster.
    by_migrations = {role for step in migrate.steps() for role in _CREATE_ROLE.findall(step.text())}

    assert "exports_retention" in by_migrations
    assert set(_CREATE_ROLE.findall(migrate.schema().text())) == by_migrations


def test_a_database_newer_than_this_release_is_refused_and_left_as_it_was(empty_db, pg_dump):
    migrate.migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (migrate.SCHEMA_VERSION + 1,))
    before = _dump(pg_dump, empty_db)

    with pytest.raises(migrate.SchemaTooNew, match=f"schema version {migrate.SCHEMA_VERSION + 1}, newer than"):
        migrate.migrate(empty_db)

    assert _versions(empty_db) == [migrate.SCHEMA_VERSION, migrate.SCHEMA_VERSION + 1]
    assert _dump(pg_dump, empty_db) == before


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
    admin.execute("WITH d AS (INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir,"
                  " host_key, credential_ref) VALUES (%s, %s, 'd', 'h', 22, 'u', '/in', 'h ssh-ed25519 AAAA', 'env:X')"
                  " RETURNING id)" + DEFAULT_PROFILE_ROW, (destination, tenant))
    with admin.transaction():
        admin.execute("""
            INSERT INTO deliveries (tenant_id, delivery_key, original_job_id, file_name)
            SELECT %(tenant)s, 'k' || n, md5('job' || n)::uuid, 'k' || n || '.csv'
            FROM generate_series(1, %(jobs)s) AS n""",
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
