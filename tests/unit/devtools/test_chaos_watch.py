"""The liveness watch starts an export's clock after the last fault that took away what it needs."""

from __future__ import annotations

from exports_devtools.chaos.record import Injection
from exports_devtools.chaos.watch import LivenessWatch


def test_each_component_is_blocked_until_the_last_fault_that_took_it_away_ended():
    injections = [Injection("kill-scheduler", "scheduler", 1.0, 5.0, frozenset({"scheduler"})),
                  Injection("pg-terminate", "workers", 2.0, 9.0, frozenset({"database", "worker"})),
                  Injection("kill-scheduler", "scheduler", 3.0, 4.0, frozenset({"scheduler"})),
                  Injection("pg-lost-reply", "export_claim", 6.0, 6.0, frozenset())]
    watch = LivenessWatch(connect=None, injections=lambda: injections, recovery_interval=1, sweep_after=20,
                          sweep_interval=5, grace=10, history=None)  # type: ignore[arg-type]

    assert watch._last_ends() == {"scheduler": 5.0, "database": 9.0, "worker": 9.0}
