"""The faults of the processes: a worker stopped past its lease, a process killed at a random moment,
and the worker owning an export killed at a chosen point of its build or its upload."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from exports_devtools.chaos.faults.common import (
    BOUND,
    attempt_in,
    kill_owners,
    past_the_lease,
    pause,
    typical_size,
    wait_for,
)
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem
from exports_devtools.processes import pid_of_client_port
from exports_devtools.sftp_faults import Trap


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
    """SIGKILL of a process (a random worker, the relay, the scheduler or the notifier) at a random moment, started
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

