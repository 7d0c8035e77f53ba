"""The faults of the database: a reply or a request lost at the proxy, a statement stalled past the
lease, the workers' sessions terminated, the server restarted."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from exports_devtools.chaos.faults.common import BOUND, hold_past_the_lease, wait_for
from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.system import WORKER_APPLICATION_NAMES, ChaosSystem
from exports_devtools.pgproxy import Cut, Hold
from exports_devtools.store import owner as store

#: Named statements the relay, the workers and the scheduler run, the frequent ones more than once so a
#: random pick mostly finds its statement within the bound. Cutoff 2 and the terminal write carry the
#: attempt's evidence, so losing their replies loses the evidence's too.
LOST_RESPONSE_STATEMENTS = (
    "export_claim", "export_claim", "export_authorize_delivery", "export_authorize_delivery",
    "export_authorize_delivery", "export_finish_delivery", "export_finish_delivery", "export_lease_renew",
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
        started, seconds = hold_past_the_lease(system, rng, stop, hold.release)
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
