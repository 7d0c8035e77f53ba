"""Shared fixtures: a real PostgreSQL (the machine's when EXPORTS_TEST_DATABASE_URL is set, else the
embedded one), migrated once into a template database whose copies serve one test each, and connections that run
under the restricted roles exactly as the processes do."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

# Before anything imports them, so their asserts are rewritten like a test module's.
pytest.register_assert_rewrite("tests.support", "tests.fixtures")

from app.store.database import Database, connect  # noqa: E402
from app.store.migrate import migrate  # noqa: E402
from app.store.types import Role  # noqa: E402

# Every module in tests/fixtures/ is a fixture plugin (SFTP servers, the database proxy, processes...),
# and so is tests/support.py (``threads``).
pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}" for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if path.stem != "__init__"
) + ["tests.support"]

IN_CI = os.environ.get("CI") == "true"

#: Connections one xdist worker's tests may hold at once on a configured server: a system test's relay,
#: two workers (pools, session slots, stop watcher, leases, builds) and scheduler, plus the test's own.
CONNECTIONS_PER_WORKER = 80


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker takes two Redis database numbers of its own on the configured
    server (gw0 the configured one and the one below it for the chaos system, gw1 the two below
    those...), so one worker's flush or queue never reaches another's; databases, embedded servers and
    ports are per test already, and the one test on RabbitMQ's shared vhost has it alone. A configured
    PostgreSQL must take every worker's connections at once: the run stops at once, saying so, when
    its max_connections is too low, rather than fail tests at random with "too many clients"."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    database = os.environ.get("EXPORTS_TEST_DATABASE_URL")
    if database and not worker:
        workers = getattr(config.option, "numprocesses", None) or 1
        with psycopg.connect(database, connect_timeout=10) as conn:
            limit = int(conn.execute("SHOW max_connections").fetchone()[0])
        if limit < CONNECTIONS_PER_WORKER * workers:
            raise pytest.UsageError(
                f"EXPORTS_TEST_DATABASE_URL's server allows {limit} connections; {workers} test worker(s) need "
                f"{CONNECTIONS_PER_WORKER * workers}: ALTER SYSTEM SET max_connections = "
                f"{CONNECTIONS_PER_WORKER * workers} and restart it, or run fewer workers (make test TEST_WORKERS=N)")
    url = os.environ.get("EXPORTS_TEST_BROKER_URL")
    if not (worker.startswith("gw") and url):
        return
    base, _, query = url.partition("?")
    scheme, _, rest = base.partition("://")
    host, _, db = rest.partition("/")
    number = int(db or 0) - 2 * int(worker[2:])
    if number < 1:
        raise pytest.UsageError(f"EXPORTS_TEST_BROKER_URL's database {db or 0} leaves no free database for {worker}")
    os.environ["EXPORTS_TEST_BROKER_URL"] = f"{scheme}://{host}/{number}" + (f"?{query}" if query else "")


def _with_db(url: str, dbname: str) -> str:
    return make_conninfo(url, dbname=dbname)


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A superuser URL on the server the tests use."""
    url = os.environ.get("EXPORTS_TEST_DATABASE_URL")
    if url:
        yield url
        return
    import fcntl
    import shutil
    import tempfile

    import pgserver

    # Not under pytest's basetemp: pytest prunes old basetemp folders, and a concurrent run pruning
    # ours would pull the data directory from under a live server.
    pgdata = Path(tempfile.mkdtemp(prefix="exports-test-pg-"))
    # Each xdist worker starts a server of its own, one at a time: run as root, pgserver creates the
    # system user its servers run as, and two first starts racing on that user left one initdb unable
    # to enter its data directory. A start takes about a second.
    with open(Path(tempfile.gettempdir()) / "exports-test-pg.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = pgserver.get_server(pgdata, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    name = f"exports_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(_with_db(pg_server_url, name))
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# Everything a test could add to a database beyond rows: a copy whose catalog differs from the
# template's afterwards is dropped rather than recycled.
_CATALOG_FINGERPRINT = """
SELECT md5(coalesce(string_agg(item, ',' ORDER BY item), '')) FROM (
    SELECT 'rel:' || relname FROM pg_class WHERE relnamespace = 'public'::regnamespace
    UNION ALL SELECT 'trg:' || tgname FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL SELECT 'fn:' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
    UNION ALL SELECT 'con:' || conname FROM pg_constraint WHERE connamespace = 'public'::regnamespace
    UNION ALL SELECT 'pol:' || polname FROM pg_policy
    UNION ALL SELECT 'acl:' || relname || coalesce(relacl::text, '') FROM pg_class
        WHERE relnamespace = 'public'::regnamespace
) AS catalog(item)
"""


class _DatabaseCopies:
    """Copies of the migrated template, one per test. CREATE and DROP DATABASE cost about a second
    each on a loaded machine (they write and sync the whole copy), so a copy whose catalog is
    unchanged after its test is emptied and handed to the next test instead: its rows are deleted
    with triggers disabled for that transaction only (the append-only triggers refuse it to
    everyone else), and every connection the test left behind is terminated first."""

    def __init__(self, server_url: str, template: str):
        self.server_url = server_url
        self.template = template
        self.free: list[str] = []
        self.all: list[str] = []
        with psycopg.connect(_with_db(server_url, template)) as conn:
            self.fingerprint = conn.execute(_CATALOG_FINGERPRINT).fetchone()[0]
            self.tables = [r[0] for r in conn.execute(
                "SELECT quote_ident(relname) FROM pg_class WHERE relnamespace = 'public'::regnamespace"
                " AND relkind = 'r' AND relname <> 'schema_version'")]

    def take(self) -> str:
        if self.free:
            return self.free.pop()
        name = f"exports_t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(self.template)))
        self.all.append(name)
        return name

    def give_back(self, name: str) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        try:
            with psycopg.connect(_with_db(self.server_url, name), autocommit=True) as conn:
                if conn.execute(_CATALOG_FINGERPRINT).fetchone()[0] != self.fingerprint:
                    raise RuntimeError("catalog changed")
                # Replica mode skips user triggers and the foreign keys' internal ones, so the
                # rows go in any order. DELETE, not TRUNCATE: a test's few rows are cheaper to delete
                # than ten tables' files are to recreate and sync.
                with conn.transaction():
                    conn.execute("SET LOCAL session_replication_role = replica")
                    for table in self.tables:
                        conn.execute(sql.SQL("DELETE FROM {}").format(sql.SQL(table)))
            self.free.append(name)
        except Exception:
            self.drop(name)

    def drop(self, name: str) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self.all.remove(name)

    def drop_all(self) -> None:
        for name in list(self.all):
            self.drop(name)


@pytest.fixture(scope="session")
def _database_copies(pg_server_url: str, template_db: str) -> Iterator[_DatabaseCopies]:
    copies = _DatabaseCopies(pg_server_url, template_db)
    yield copies
    copies.drop_all()


@pytest.fixture
def db_url(_database_copies: _DatabaseCopies) -> Iterator[str]:
    """A superuser URL for a database in exactly the migrated template's state, used by this test alone."""
    name = _database_copies.take()
    yield _with_db(_database_copies.server_url, name)
    _database_copies.give_back(name)


@pytest.fixture
def connect_as(db_url: str) -> Iterator[Callable[..., psycopg.Connection]]:
    """Opens connections under a role; all are closed after the test."""
    opened: list[psycopg.Connection] = []

    def _connect(role: Role = Role.APP, **kwargs) -> psycopg.Connection:
        conn = connect(db_url, role, **kwargs)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


@pytest.fixture
def conn(connect_as) -> psycopg.Connection:
    """An autocommit connection as exports_app."""
    return connect_as(Role.APP)


@pytest.fixture
def admin(db_url: str) -> Iterator[psycopg.Connection]:
    """The owner, for seeding what no role may write and for inspecting; never for protocol writes."""
    from psycopg.rows import dict_row

    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def app_db(db_url: str) -> Iterator[Database]:
    with Database(db_url, Role.APP, max_size=4) as db:
        yield db


@pytest.fixture
def seed(conn, admin):
    """Builds rows in a given state through the real statements (tests/factories.py)."""
    from tests.factories import Seeder

    return Seeder(conn, admin)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI a skipped test is a failure: a test that needs a service must have it there."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if IN_CI and skipped and exitstatus == 0:
        reporter.write_line(f"CI=true: {skipped} test(s) skipped; every test must run in CI", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
