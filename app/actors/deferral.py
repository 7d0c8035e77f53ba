"""When the partner cannot be reached before cutoff 2: the backoff, the destination's circuit, and the
deferral that puts the job back in the queue with a wake-up due later.

Nothing has left the process before cutoff 2, so a partner that refuses or drops the connection, times
out, or has no session free costs the attempt nothing but time: it defers (``export.defer``, Running ->
Queued for this attempt, with its event and a wake-up due after a backoff) instead of failing. Only a
host key that is not the pinned one or a rejected credential (configuration) fails at once, and a job
whose partner stays unreachable past the deferral budget fails with the last cause.

The circuit is shared by every worker host (``app.store.partner``): after a connection failure it opens,
and attempts for that destination defer right after their claim, without building, until its next probe
is due; then one attempt claims the probe and goes on. Its connection closes the circuit; its failure
reopens it with a longer backoff. An outage costs about one connection attempt per probe interval, not
one build per job. The circuit is an economy, not a guarantee: whatever goes wrong with it (the database
does not answer) the attempt goes on and learns from the partner itself.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from app import logs, metrics
from app.config import ConfigError, Settings
from app.store import partner
from app.store.database import Database
from app.store.partner import Circuit

log = logs.get(__name__)

#: The cause a deferral records when the destination's circuit is open.
CIRCUIT_OPEN = "circuit open"
#: The start of the cause a deferral records when its attempt was the circuit's probe and found the
#: partner still down (it connected before building, so it built nothing).
PROBE_FAILED = "probe failed: "
#: Seconds, at most, an attempt defers when all its destination's session slots are held: a session
#: frees up within one delivery, so it comes back soon, jittered so the waiting attempts spread out.
SESSION_BUSY_SECONDS = 1.0

Random = Callable[[], float]


def backoff_seconds(deferrals: int, *, base: float, cap: float, rand: Random = random.random) -> float:
    """The delay before the wake-up of a job deferred ``deferrals`` times already: base * 2^deferrals,
    capped, then jittered down to between half and all of it, so jobs deferred together come back
    spread out rather than in one burst."""
    exponent = min(max(deferrals, 0), 30)
    ceiling = min(cap, base * 2 ** exponent)
    return ceiling * (0.5 + 0.5 * rand())


def session_busy_seconds(rand: Random = random.random) -> float:
    """The short, jittered delay of an attempt that found no session slot free."""
    return SESSION_BUSY_SECONDS * (0.25 + 0.75 * rand())


@dataclass(frozen=True)
class DeferralPolicy:
    base_seconds: float = 5.0
    max_seconds: float = 300.0
    #: Past this long since its first deferral, a job fails (NotDelivered) instead of deferring again.
    total_seconds: float = 6 * 3600.0
    #: How long a claimed probe is this attempt's alone: about as long as it takes to build and connect.
    probe_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.base_seconds <= self.max_seconds:
            raise ConfigError("the deferral backoff needs 0 < base_seconds <= max_seconds")
        if self.total_seconds <= 0 or self.probe_seconds <= 0:
            raise ConfigError("total_seconds and probe_seconds must be positive")

    @classmethod
    def from_settings(cls, settings: Settings) -> DeferralPolicy:
        return cls(base_seconds=settings.defer_base_seconds, max_seconds=settings.defer_max_seconds,
                   total_seconds=settings.defer_total_seconds, probe_seconds=settings.lease_seconds)


class Gate(enum.Enum):
    """What an attempt does, given its destination's circuit as read before its claim."""

    GO = "go"          # closed: try the partner
    PROBE = "probe"    # open and its probe is due, held by nobody: claim the probe, then try
    WAIT = "wait"      # open, probe not due or held by another attempt: defer without building


def decide_circuit(circuit: Circuit) -> Gate:
    if not circuit.open:
        return Gate.GO
    due = circuit.probe_in_seconds is not None and circuit.probe_in_seconds <= 0
    return Gate.PROBE if due and not circuit.probe_held else Gate.WAIT


def circuit_wait_seconds(circuit: Circuit, policy: DeferralPolicy, rand: Random = random.random) -> float:
    """An attempt turned away by the open circuit comes back just after the next probe is due, jittered,
    so it finds the circuit closed if the probe connected; when the probe is due already (another attempt
    holds it), after a short backoff."""
    probe_in = circuit.probe_in_seconds
    if probe_in is not None and probe_in > 0:
        return probe_in + policy.base_seconds * (0.1 + 0.4 * rand())
    return policy.base_seconds * (0.5 + 0.5 * rand())


@dataclass(frozen=True)
class Admission:
    """Whether the attempt goes on to build and connect, and whether it is the circuit's probe."""

    go: bool
    probing: bool = False
    #: For an attempt turned away: how long until it should come back.
    wait_seconds: float = 0.0


class Circuits:
    """The circuit's decisions and writes for the runner; every database error is logged and leaves the
    attempt to learn from the partner itself."""

    def __init__(self, db: Database, policy: DeferralPolicy, rand: Random = random.random) -> None:
        self.db = db
        self.policy = policy
        self.rand = rand

    def admit(self, destination_id: UUID, attempt_id: UUID, circuit: Circuit) -> Admission:
        gate = decide_circuit(circuit)
        if gate is Gate.GO:
            return Admission(go=True)
        if gate is Gate.PROBE:
            try:
                with self.db.connection() as conn:
                    if partner.claim_probe(conn, destination_id=destination_id, attempt_id=attempt_id,
                                           probe_seconds=self.policy.probe_seconds):
                        log.info("circuit.probe_claimed", destination_id=destination_id, attempt_id=attempt_id)
                        return Admission(go=True, probing=True)
            except Exception as exc:
                log.warning("circuit.probe_claim_failed", destination_id=destination_id, error=type(exc).__name__)
                return Admission(go=True, probing=True)
        return Admission(go=False, wait_seconds=circuit_wait_seconds(circuit, self.policy, self.rand))

    def reached(self, destination_id: UUID, *, was_open: bool) -> None:
        """The partner answered: an open circuit closes. Skipped when it was closed at the claim, so a
        healthy delivery costs no write here."""
        if not was_open:
            return
        try:
            with self.db.connection() as conn:
                if partner.close_circuit(conn, destination_id=destination_id):
                    log.info("circuit.closed", destination_id=destination_id)
        except Exception as exc:
            log.warning("circuit.close_failed", destination_id=destination_id, error=type(exc).__name__)

    def failed(self, destination_id: UUID, attempt_id: UUID, error: str) -> None:
        """A connection failed: the circuit opens (or, after a failed probe, reopens with more backoff)."""
        try:
            with self.db.connection() as conn:
                failure = partner.record_failure(conn, destination_id=destination_id, attempt_id=attempt_id,
                                                 error=error, base_seconds=self.policy.base_seconds,
                                                 max_seconds=self.policy.max_seconds)
        except Exception as exc:
            log.warning("circuit.record_failed", destination_id=destination_id, error=type(exc).__name__)
            return
        if failure.opened:
            metrics.worker().circuit_openings.inc()
            log.warning("circuit.opened", destination_id=destination_id, attempt_id=attempt_id, error=error,
                        next_probe_at=failure.next_probe_at)
