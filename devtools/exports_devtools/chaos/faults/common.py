"""What every fault of the chaos soak shares: the ``Fault`` protocol, how long a fault waits for its
point (``BOUND``), and the helpers that wait, pause, and find and kill the worker owning an attempt.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from uuid import UUID

from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem
from exports_devtools.store import owner as store

#: Seconds a fault waits for its point before it gives up (and returns None).
BOUND = 20.0
#: Seconds between two looks at whether the soak is stopping, while a fault waits.
POLL = 0.1
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


def typical_size(system: ChaosSystem) -> int:
    """The size of the files the partner received lately (every export of one tenant is about the same
    size), so a cut or a hold "past N bytes" falls inside an upload."""
    journal = system.partner_journal()
    return journal[-1].size if journal else 100_000


def hold_past_the_lease(system: ChaosSystem, rng: random.Random, stop: threading.Event,
                        release: Callable[[], None]) -> tuple[float, float]:
    """Keeps a hold that has been reached for past the lease (less if the soak stops), then releases it;
    returns when it started and how many seconds it was meant to last."""
    started = time.time()
    seconds = past_the_lease(system, rng)
    try:
        pause(stop, seconds)
    finally:
        release()
    return started, seconds
