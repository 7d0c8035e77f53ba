"""The soak's liveness watch: while faults run, nothing may stay stuck longer than the protocol allows.

- A Running or Delivering export must be taken over within a recovery interval of its lease's expiry;
- a Queued export must get a new wake-up within the sweeper's threshold plus its interval.

Some faults take away exactly what would unstick an export (the scheduler killed or paused, the
database restarted or stalled, the partner down while recovery must look at it): the clock of an
export then starts when the last such fault ended, not at its lease's expiry. Beyond that, ``grace``
absorbs a loaded machine's slowness (process start-up after a kill, a scheduler tick that runs late);
docs/reliability.md states it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from exports_devtools.chaos.record import Injection, Violation
from exports_devtools.store import chaos

#: What must work for an expired lease to be taken over, by the status the export is in.
TAKEOVER_NEEDS = {
    "Running": frozenset({"scheduler", "database"}),
    # recovery resolves an expired delivery only from the partner's evidence
    "Delivering": frozenset({"scheduler", "database", "partner"}),
}
#: What must work for a Queued export without a wake-up to get a new one (the sweeper); a paused destination's
#: queued exports get none until the resume, whose statement wakes them.
SWEEP_NEEDS = frozenset({"scheduler", "database", "destinations"})


@dataclass
class LivenessWatch:
    connect: Callable[[], psycopg.Connection[dict[str, Any]]]
    injections: Callable[[], Iterable[Injection]]
    recovery_interval: float
    sweep_after: float
    sweep_interval: float
    grace: float
    history: Callable[[psycopg.Connection[dict[str, Any]], UUID], dict[str, Any]]
    violations: list[Violation] = field(default_factory=list)
    _reported: set[tuple[str, UUID]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _last_ends(self) -> dict[str, float]:
        """When the last fault that took each component away ended: one pass over the injections per look,
        not one per overdue export."""
        ends: dict[str, float] = {}
        for injection in self.injections():
            for component in injection.blocks:
                ends[component] = max(ends.get(component, 0.0), injection.ended)
        return ends

    def sample(self, now: float) -> None:
        """One look at the database; a violation is recorded once per export and rule."""
        ends = self._last_ends()

        def blocked_until(needs: frozenset[str]) -> float:
            return max((ends.get(component, 0.0) for component in needs), default=0.0)

        with self.connect() as conn:
            for row in chaos.overdue_leases(conn, grace_seconds=self.recovery_interval + self.grace):
                expired = _epoch(row["lease_expires_at"])
                since = max(expired, blocked_until(TAKEOVER_NEEDS.get(row["status"], SWEEP_NEEDS)))
                if now - since > self.recovery_interval + self.grace:
                    self._violate(conn, "lease-not-taken-over", row,
                                  f"{row['status']} with a lease that expired {now - expired:.1f}s ago "
                                  f"({now - since:.1f}s after the last fault that could hold recovery up), "
                                  f"claimed by {row['claimed_by']}")
            bound = self.sweep_after + self.sweep_interval + self.grace
            for row in chaos.stale_queued(conn, older_than_seconds=bound):
                since = max(_epoch(row["last_wake_up"]), blocked_until(SWEEP_NEEDS))
                if now - since > bound:
                    self._violate(conn, "queued-without-wake-up", row,
                                  f"Queued with its newest wake-up {now - _epoch(row['last_wake_up']):.1f}s old")

    def _violate(self, conn: psycopg.Connection[dict[str, Any]], rule: str, row: dict[str, Any], detail: str) -> None:
        key = (rule, row["id"])
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        self.violations.append(Violation(rule, row["id"], detail, self.history(conn, row["id"])))


def _epoch(value: datetime | float | None) -> float:
    if value is None:
        return 0.0
    return value.timestamp() if isinstance(value, datetime) else float(value)
