"""The operator's fault: a destination paused (or drained) for a few seconds, then resumed, as ``destination
pause|drain|resume`` do it, while exports to it flow and every other fault runs."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from uuid import UUID

from app.store import pausing
from app.store.database import connect
from app.store.types import Role
from exports_devtools.chaos.faults.common import pause
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem

#: The operator the soak pauses and resumes as, in the destination's history.
OPERATOR = "chaos"
#: Seconds the resume is retried for while the database is restarting or stalled under another fault.
RESUME_WITHIN = 120.0


@dataclass
class DestinationPaused:
    """One of the tenant's destinations paused (its queued exports held unclaimed, attempts already running
    left to finish) or drained (running ones finish first), for one to four seconds, then resumed: the
    resume's statement wakes what it held. A pause the database may not have taken (its reply lost under
    another fault) is resumed all the same."""

    kind: str = "destination-paused"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.tenant_id is not None and system.destination_ids
        destination = rng.choice(system.destination_ids)
        hold = pausing.drain_destination if rng.random() < 0.5 else pausing.pause_destination
        seconds = rng.uniform(1.0, 4.0)
        started = time.time()
        try:
            with connect(system.app_url, Role.APP, application_name="exports-chaos-operator") as conn:
                held = hold(conn, tenant_id=system.tenant_id, destination_id=destination, changed_by=OPERATOR,
                            reason="chaos soak")
        except Exception:   # the database is down under another fault: resume whatever may have committed
            held = True
        try:
            if held:
                pause(stop, seconds)
        finally:
            self._resume(system, destination)
        if not held:
            return None   # paused already: nothing this injection did
        verb = "drained" if hold is pausing.drain_destination else "paused"
        return Injection(self.kind, str(destination), started, time.time(), frozenset({"destinations"}),
                         f"{verb} for {seconds:.1f}s")

    @staticmethod
    def _resume(system: ChaosSystem, destination: UUID) -> None:
        assert system.tenant_id is not None
        deadline = time.monotonic() + RESUME_WITHIN
        while True:
            try:
                with connect(system.app_url, Role.APP, application_name="exports-chaos-operator") as conn:
                    pausing.resume_destination(conn, tenant_id=system.tenant_id, destination_id=destination,
                                               changed_by=OPERATOR, reason="chaos soak")
                return
            except Exception:
                # A lost reply may hide a resume that committed; resuming an active destination changes nothing.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)   # the database comes back from a restart or a stall
