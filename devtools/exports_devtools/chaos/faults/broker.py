"""The faults of the broker: Redis restarted, the export queue's messages lost."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from app.relay import EXPORT_QUEUE
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem

#: Dramatiq's Redis key namespace (its default, which app.broker keeps).
DRAMATIQ_NAMESPACE = "dramatiq"


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
