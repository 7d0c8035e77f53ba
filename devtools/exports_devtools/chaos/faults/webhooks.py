"""The fault of the tenant's webhook receiver: down for a few seconds (connections refused), on top of
the 503 it answers to a share of requests all along."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from exports_devtools.chaos.faults.common import pause
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem


@dataclass
class ReceiverDown:
    """The receiver stops listening for one to four seconds, then comes back on the same port: the
    notifier's requests meanwhile are refused and tried again after their backoff."""

    kind: str = "webhook-receiver-down"

    def inject(self, system: ChaosSystem, rng: random.Random, stop: threading.Event) -> Injection | None:
        assert system.receiver is not None
        seconds = rng.uniform(1.0, 4.0)
        started = time.time()
        system.receiver.stop()
        try:
            pause(stop, seconds)
        finally:
            system.receiver.start()
        return Injection(self.kind, system.receiver.url, started, time.time(), frozenset({"webhooks"}),
                         f"down for {seconds:.1f}s")
