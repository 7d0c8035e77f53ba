"""The faults of the partner: an upload cut or a rename's reply lost, a request stalled past the
lease, the link down for a few seconds."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from exports_devtools.chaos.faults.common import BOUND, hold_past_the_lease, pause, typical_size, wait_for
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem

#: The SFTP requests a stall can hold.
STALLED_REQUESTS = ("open", "write", "rename", "stat")


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
        started, seconds = hold_past_the_lease(system, rng, stop, trap.release)
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
