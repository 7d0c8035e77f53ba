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

The kinds live by what they strike: ``database.py``, ``processes.py``, ``partner.py``, ``broker.py``,
``webhooks.py``, ``destinations.py``;
``common.py`` has the protocol and the helpers they share. ``KINDS`` lists them all, in a stable order;
this module re-exports every name the single ``faults.py`` it replaces had.
"""

from __future__ import annotations

import random
import threading

from exports_devtools.chaos.faults.broker import DRAMATIQ_NAMESPACE, BrokerQueueLost, RedisRestart
from exports_devtools.chaos.faults.common import (
    BOUND,
    POLL,
    Fault,
    attempt_in,
    kill_owners,
    lease_seconds,
    owner_of,
    past_the_lease,
    pause,
    typical_size,
    wait_for,
)
from exports_devtools.chaos.faults.database import (
    LOST_RESPONSE_STATEMENTS,
    STALLED_STATEMENTS,
    PgLostResponse,
    PgRestart,
    PgStall,
    PgTerminate,
)
from exports_devtools.chaos.faults.destinations import DestinationPaused
from exports_devtools.chaos.faults.partner import STALLED_REQUESTS, PartnerDown, SftpStall, SftpTrap
from exports_devtools.chaos.faults.processes import KillAtPartner, KillMidBuild, KillProcess, SigstopWorker
from exports_devtools.chaos.faults.webhooks import ReceiverDown
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import ChaosSystem

__all__ = [
    "BOUND", "DRAMATIQ_NAMESPACE", "DestinationPaused",
    "KINDS", "LASTING_KINDS", "LOST_RESPONSE_STATEMENTS", "POLL", "STALLED_REQUESTS",
    "STALLED_STATEMENTS", "WAITING_KINDS", "BrokerQueueLost", "Fault", "Injection", "KillAtPartner", "KillMidBuild",
    "KillProcess", "PartnerDown", "PgLostResponse", "PgRestart", "PgStall", "PgTerminate", "ReceiverDown",
    "RedisRestart",
    "SftpStall", "SftpTrap", "SigstopWorker", "attempt_in", "inject", "kill_owners", "lease_seconds", "owner_of",
    "past_the_lease", "pause", "typical_size", "wait_for",
]


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
        KillProcess("kill-notifier", ("notifier",), frozenset({"notifier"})),
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
        ReceiverDown(),
        DestinationPaused(),
    ]
    return {fault.kind: fault for fault in faults}


#: Every fault kind, by name, in a stable order.
KINDS: dict[str, Fault] = _registry()
#: Kinds that wait for a moment of an export (a build, an upload, a rename) and miss it when none comes
#: within their bound: the soak arms them this much more often than the others, so every kind ends
#: with about as many injections.
#: Kinds whose every injection lasts past a lease (longer than their mean interval): each runs in this many
#: threads, each at that many times the interval, or one thread could not keep their rate.
LASTING_KINDS = {"pg-stall": 2, "sftp-stall": 2, "sigstop-worker": 2}
WAITING_KINDS = {"pg-lost-reply": 1.3, "pg-lost-request": 1.3, "pg-stall": 1.2, "sftp-stall": 1.6,
                 "kill-mid-build": 1.3, "kill-after-cutoff-2": 1.3, "kill-mid-upload": 1.3, "kill-after-rename": 1.5,
                 "sftp-cut-upload": 1.2, "sftp-lost-rename-reply": 1.5}


def inject(kind: str, system: ChaosSystem, rng: random.Random,
           stop: threading.Event | None = None) -> Injection | None:
    """Injects one fault of ``kind``."""
    return KINDS[kind].inject(system, rng, stop or threading.Event())
