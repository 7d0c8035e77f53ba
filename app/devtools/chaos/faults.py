"""The chaos soak's faults, one class per kind, injected into a running ``ChaosSystem``.

Each has a ``kind`` and ``inject(system, rng, stop) -> Injection | None``: it arms its fault, waits (at
most ``bound`` seconds, or until ``stop`` is set) for the point it strikes at, strikes, undoes what must
be undone (a held statement released, a stopped worker continued, a killed process started again), and
returns what it did. None when its point never came in time: then nothing was done and nothing stays
armed. Faults of different kinds can run at once from several threads: each arms hooks of its own.

A fault at a chosen point kills the worker process that owns the job there: the attempt id in the file
the point caught (the build's ``{job}.{attempt}.csv.part``, the upload's ``.{final}.{attempt}.part``)
names the job's ``claimed_by`` (``host:pid:thread``), which names the worker. When no owner can be
found, every worker is a candidate and every one is killed.

``KINDS`` lists them all, in a stable order.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol
from uuid import UUID

from app.devtools.chaos.record import Injection
from app.devtools.chaos.system import WORKER_APPLICATION_NAMES, ChaosSystem
from app.devtools.pgproxy import Cut, Hold
from app.devtools.processes import pid_of_client_port
from app.devtools.sftp_subsystem import Trap
from app.relay import EXPORT_QUEUE
from app.store import devtools as store

#: Seconds a fault waits for its point before it gives up (and returns None).
BOUND = 20.0
#: Seconds between two looks at whether the soak is stopping, while a fault waits.
POLL = 0.1
#: Dramatiq's Redis key namespace (its default, which app.actors.broker keeps).
DRAMATIQ_NAMESPACE = "dramatiq"

#: Named statements the relay, the workers and the scheduler run, the frequent ones more than once so a
#: random pick mostly finds its statement within the bound.
LOST_RESPONSE_STATEMENTS = (
    "export_claim", "export_claim", "export_authorize_delivery", "export_authorize_delivery",
    "export_finish_delivery", "export_finish_delivery", "export_lease_renew", "export_append_evidence",
    "export_defer", "export_finish_stopped", "worker_read_job", "worker_copy_consenting_contacts",
    "relay_claim_batch", "relay_mark_published", "relay_mark_published", "recovery_scan_expired",
    "recovery_requeue_expired", "recovery_resolve_delivering", "recovery_claim_inspection",
    "sweeper_republish_due", "partner_try_slot",
)
#: Statements whose connection a stall holds past the lease.
STALLED_STATEMENTS = (
    "export_claim", "export_authorize_delivery", "export_finish_delivery", "export_lease_renew",
    "export_lease_renew", "worker_copy_consenting_contacts", "relay_claim_batch", "relay_mark_published",
    "recovery_scan_expired", "partner_try_slot",
)
#: The SFTP requests a stall can hold.
STALLED_REQUESTS = ("open", "write", "rename", "stat")
#: A hyphenated UUID: attempt ids in file names (the final name's own id has no hyphens).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Fault(Protocol):
    kind: str

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None: ...


# -- helpers --------------------------------------------------------------------------------------------


def wait_for(event: threading.Event, stop: threading.Event, seconds: float) -> bool:
    """True once ``event`` is set; False if ``seconds`` pass or the soak stops first."""
    deadline = time.monotonic() + seconds
    while not event.wait(min(POLL, max(0.0, deadline - time.monotonic()))):
        if stop.is_set() or time.monotonic() >= deadline:
            return event.is_set()
    return True


def pause(stop: threading.Event, seconds: float) -> None:
    """Sleeps ``seconds``, or less when the soak stops: a fault's outage lasting its chosen time."""
    stop.wait(seconds)


def lease_seconds(system: ChaosSystem) -> float:
    return float(system.settings.get("EXPORTS_LEASE_SECONDS", "4"))


def past_the_lease(system: ChaosSystem, rng: random.Random) -> float:
    """Seconds an outage lasts to outlive a lease: the lease and one to three more."""
    return lease_seconds(system) + rng.uniform(1.0, 3.0)


def attempt_in(path: str | None) -> UUID | None:
    """The attempt id a work or upload file is named with: the last UUID in its name."""
    found = _UUID.findall(Path(path or "").name)
    return UUID(found[-1]) if found else None


def owner_of(system: ChaosSystem, attempt_id: UUID | None) -> str | None:
    """The ``claimed_by`` of the job whose current attempt is ``attempt_id``."""
    if attempt_id is None:
        return None
    with system.owner_lock:
        row = store.attempt_owner(system.owner(), attempt_id)
    return row["claimed_by"] if row else None


def kill_owners(system: ChaosSystem, attempts: list[UUID]) -> tuple[list[str], str]:
    """Kills (and restarts) the workers owning ``attempts``, or every worker when none is found;
    returns their names and a detail saying how they were chosen."""
    names = sorted({running.name for attempt in attempts
                    if (running := system.worker_for(owner_of(system, attempt))) is not None})
    how = f"owner of attempt(s) {', '.join(str(a) for a in attempts)}"
    if not names:
        names = sorted(r.name for r in system.workers())
        how = f"no owner found for attempt(s) {', '.join(str(a) for a in attempts) or '?'}: every worker"
    for name in names:
        system.kill(name)
    return names, how


# -- the database ---------------------------------------------------------------------------------------


@dataclass
class PgLostResponse:
    """The connection cut right after the server's whole reply to a random named statement (the commit
    acknowledgment lost), or right before the request reaches the server."""

    kind: str
    after_reply: bool
    bound: float = BOUND

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.proxy is not None
        statement = rng.choice(LOST_RESPONSE_STATEMENTS)
        arm = system.proxy.cut_after_reply if self.after_reply else system.proxy.cut_before
        cut: Cut = arm(statement)
        if not wait_for(cut.fired, stop, self.bound) and system.proxy.disarm(cut):
            return None
        cut.fired.wait(5)   # taken just as the wait ended: it is firing now
        at = time.time()
        where = "after its reply" if self.after_reply else "before it reached the server"
        return Injection(self.kind, statement, at, at, frozenset({"database"}),
                         f"connection cut {where}")


@dataclass
class PgStall:
    """A named statement's connection held at the proxy past the lease (its request not forwarded, or
    its reply not passed on), then released."""

    kind: str = "pg-stall"
    bound: float = BOUND

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.proxy is not None
        statement = rng.choice(STALLED_STATEMENTS)
        after_reply = rng.random() < 0.5
        hold: Hold = system.proxy.hold_statement(statement, after_reply=after_reply)
        if not wait_for(hold.reached, stop, self.bound) and system.proxy.disarm(hold):
            return None
        hold.reached.wait(5)
        started = time.time()
        seconds = past_the_lease(system, rng)
        try:
            pause(stop, seconds)
        finally:
            hold.release()
        return Injection(self.kind, statement, started, time.time(), frozenset({"database"}),
                         f"held {'its reply' if after_reply else 'the request'} for {seconds:.1f}s")


@dataclass
class PgTerminate:
    """pg_terminate_backend of every session the workers have open."""

    kind: str = "pg-terminate"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        at = time.time()
        with system.owner_lock:
            ended = store.terminate_sessions(system.owner(), WORKER_APPLICATION_NAMES)
        return Injection(self.kind, "workers' sessions", at, time.time(), frozenset({"database", "worker"}),
                         f"terminated {ended} session(s)")


@dataclass
class PgRestart:
    """The embedded PostgreSQL stopped and started again; on a configured server, every session of the
    soak's database terminated (the detail says which)."""

    kind: str = "pg-restart"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        started = time.time()
        detail = system.restart_database()
        return Injection(self.kind, "postgresql", started, time.time(), frozenset({"database"}), detail)


# -- processes ------------------------------------------------------------------------------------------


@dataclass
class SigstopWorker:
    """A worker (with its children) stopped with SIGSTOP past its lease, then continued."""

    kind: str = "sigstop-worker"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        name = rng.choice(sorted(r.name for r in system.workers()))
        started = time.time()
        stopped = system.signal_group(name, signal.SIGSTOP)
        seconds = past_the_lease(system, rng)
        try:
            pause(stop, seconds)
        finally:
            try:
                os.killpg(stopped.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass   # killed meanwhile by another fault, and started again
        return Injection(self.kind, name, started, time.time(), frozenset({"worker"}),
                         f"stopped for {seconds:.1f}s (pid {stopped.pid})")


@dataclass
class KillProcess:
    """SIGKILL of a process (a random worker, the relay or the scheduler) at a random moment, started
    again at once."""

    kind: str
    names: tuple[str, ...]
    blocks: frozenset[str]

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        candidates = [r.name for r in system.workers()] if self.names == ("worker",) else list(self.names)
        name = rng.choice(sorted(candidates))
        started = time.time()
        old = system.process(name).pid
        new = system.kill(name).pid
        return Injection(self.kind, name, started, time.time(), self.blocks, f"pid {old} killed, {new} started")


@dataclass
class KillMidBuild:
    """The worker owning a build killed while the build waits on its query of the contacts (held at the
    proxy, its partial file open)."""

    kind: str = "kill-mid-build"
    bound: float = BOUND
    statement: ClassVar[str] = "worker_copy_consenting_contacts"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.proxy is not None
        hold = system.proxy.hold_statement(self.statement)
        if not wait_for(hold.reached, stop, self.bound) and system.proxy.disarm(hold):
            return None
        hold.reached.wait(5)
        started = time.time()
        try:
            pid = pid_of_client_port(hold.client_port) if hold.client_port else None
            worker = system.worker_of_pid(pid) if pid else None
            if worker is not None:
                system.kill(worker.name)
                names, how = [worker.name], f"the worker whose connection (pid {pid}) was held"
            else:
                # The held build's partial file is open and empty: its query has not run.
                attempts = [a for path in system.work_dir.glob("*.csv.part")
                            if _empty(path) and (a := attempt_in(path.name)) is not None]
                names, how = kill_owners(system, attempts)
        finally:
            hold.release()
        return Injection(self.kind, ",".join(names), started, time.time(), frozenset({"worker"}), how)


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


@dataclass
class KillAtPartner:
    """The worker owning a delivery killed while the partner holds one of its requests, then the request
    released: ``at`` "open" of the temporary file (past cutoff 2, nothing written), "write" past some
    bytes of it (mid-upload), "renamed" (the rename performed, its reply not sent)."""

    kind: str
    at: str
    bound: float = BOUND

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.partner is not None
        after_bytes = rng.randint(1, max(1, typical_size(system) - 1)) if self.at == "write" else None
        trap: Trap = system.partner.faults.arm(self.at, path_contains=".part" if self.at != "renamed" else None,
                                               after_bytes=after_bytes)
        if not wait_for(trap.reached, stop, self.bound) and system.partner.faults.disarm(trap):
            return None
        trap.reached.wait(5)
        started = time.time()
        try:
            attempt = attempt_in(trap.source if self.at == "renamed" else trap.path)
            names, how = kill_owners(system, [attempt] if attempt else [])
        finally:
            trap.release()
        where = f" past byte {after_bytes}" if after_bytes else ""
        return Injection(self.kind, ",".join(names), started, time.time(), frozenset({"worker"}),
                         f"{self.at}{where} of {trap.path}; {how}")


def typical_size(system: ChaosSystem) -> int:
    """The size of the files the partner received lately (every export of one tenant is about the same
    size), so a cut or a hold "past N bytes" falls inside an upload."""
    journal = system.partner_journal()
    return journal[-1].size if journal else 100_000


# -- the partner ----------------------------------------------------------------------------------------


@dataclass
class SftpTrap:
    """A one-shot fault at the partner: the connection cut part way into an upload, or a rename performed
    and its reply never sent."""

    kind: str
    at: str
    action: str
    bound: float = BOUND

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.partner is not None
        after_bytes = rng.randint(1, max(1, typical_size(system) - 1)) if self.at == "write" else None
        trap = system.partner.faults.arm(self.at, self.action, after_bytes=after_bytes,
                                         path_contains=".part" if self.at == "write" else None)
        if not wait_for(trap.reached, stop, self.bound) and system.partner.faults.disarm(trap):
            return None
        trap.reached.wait(5)
        at = time.time()
        where = f" past byte {after_bytes}" if after_bytes else ""
        return Injection(self.kind, trap.path or "?", at, at, frozenset({"partner"}),
                         f"{self.action} at {self.at}{where}")


@dataclass
class SftpStall:
    """A request the partner took and sat on past the lease before answering."""

    kind: str = "sftp-stall"
    bound: float = BOUND

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.partner is not None
        at = rng.choice(STALLED_REQUESTS)
        trap = system.partner.faults.arm(at)
        if not wait_for(trap.reached, stop, self.bound) and system.partner.faults.disarm(trap):
            return None
        trap.reached.wait(5)
        started = time.time()
        seconds = past_the_lease(system, rng)
        try:
            pause(stop, seconds)
        finally:
            trap.release()
        return Injection(self.kind, trap.path or "?", started, time.time(), frozenset({"partner"}),
                         f"{at} held {seconds:.1f}s")


@dataclass
class PartnerDown:
    """The link to the partner refuses new connections and drops open ones for one to three seconds:
    long enough to open the destination's circuit, short enough that two hundred of them in half an
    hour leave the partner up most of the time."""

    kind: str = "partner-down"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.link is not None
        seconds = rng.uniform(1.0, 3.0)
        started = time.time()
        system.link.refuse_connections()
        try:
            system.link.drop_all()
            pause(stop, seconds)
        finally:
            system.link.accept_connections()
        return Injection(self.kind, "partner link", started, time.time(), frozenset({"partner"}),
                         f"down for {seconds:.1f}s")


# -- the broker -----------------------------------------------------------------------------------------


@dataclass
class RedisRestart:
    """The soak's Redis shut down and started again on the same socket; a configured one has its
    clients of the soak's database disconnected (the detail says which)."""

    kind: str = "redis-restart"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        started = time.time()
        detail = system.restart_broker()
        return Injection(self.kind, "redis", started, time.time(), frozenset({"broker"}), detail)


@dataclass
class BrokerQueueLost:
    """Every message of the export queue lost: its ready, delayed and dead-letter queues, their message
    bodies, and the workers' sets of unacknowledged messages."""

    kind: str = "broker-queue-lost"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        started = time.time()
        client = system.broker_client()
        try:
            keys = list(client.scan_iter(match=f"{DRAMATIQ_NAMESPACE}:{EXPORT_QUEUE}*"))
            keys += [key for key in client.scan_iter(match=f"{DRAMATIQ_NAMESPACE}:__acks__.*")
                     if key.decode().split(".", 2)[-1].startswith(EXPORT_QUEUE)]
            deleted = client.delete(*keys) if keys else 0
        finally:
            client.close()
        return Injection(self.kind, f"queue {EXPORT_QUEUE}", started, time.time(), frozenset({"broker"}),
                         f"deleted {deleted} key(s)")


def _registry() -> dict[str, Fault]:
    faults: list[Fault] = [
        PgLostResponse("pg-lost-reply", after_reply=True),
        PgLostResponse("pg-lost-request", after_reply=False),
        PgStall(),
        PgTerminate(),
        PgRestart(),
        SigstopWorker(),
        KillProcess("kill-worker", ("worker",), frozenset({"worker"})),
        KillProcess("kill-relay", ("relay",), frozenset({"relay"})),
        KillProcess("kill-scheduler", ("scheduler",), frozenset({"scheduler"})),
        KillMidBuild(),
        KillAtPartner("kill-after-cutoff-2", "open"),
        KillAtPartner("kill-mid-upload", "write"),
        KillAtPartner("kill-after-rename", "renamed"),
        SftpTrap("sftp-cut-upload", "write", "cut"),
        SftpTrap("sftp-lost-rename-reply", "rename", "drop-reply"),
        SftpStall(),
        PartnerDown(),
        RedisRestart(),
        BrokerQueueLost(),
    ]
    return {fault.kind: fault for fault in faults}


#: Every fault kind, by name, in a stable order.
KINDS: dict[str, Fault] = _registry()
#: Kinds that wait for a moment of an export (a build, an upload, a rename) and miss it when none comes
#: within their bound: the soak arms them this much more often than the others, so every kind ends
#: with about as many injections.
WAITING_KINDS = {"pg-lost-reply": 1.3, "pg-lost-request": 1.3, "pg-stall": 1.2, "sftp-stall": 1.3,
                 "kill-mid-build": 1.3, "kill-after-cutoff-2": 1.3, "kill-mid-upload": 1.3, "kill-after-rename": 1.5,
                 "sftp-cut-upload": 1.2, "sftp-lost-rename-reply": 1.5}


def inject(kind: str, system: ChaosSystem, rng: random.Random,
           stop: threading.Event | None = None) -> Injection | None:
    """Injects one fault of ``kind``."""
    return KINDS[kind].inject(system, rng, stop or threading.Event())
