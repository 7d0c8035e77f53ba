"""The end-to-end workload's account of the gap to Procrastinate, from the run's own medians."""

from __future__ import annotations

from bench.closed_loop import SideRun
from bench.workloads.end_to_end import OURS, _gap


def _side(name: str, rates: list[float], python_ms: float, postgresql_ms: float, transactions: float,
          cpu_ms: float = 7.0) -> list[SideRun]:
    costs = {"cpu_python_ms": python_ms, "cpu_postgresql_ms": postgresql_ms, "transactions": transactions,
             "cpu_ms": cpu_ms}
    return [SideRun(name, rate, int(rate), 1.0, dict(costs), {}) for rate in rates]


def test_the_gap_splits_into_the_system_over_the_floor_and_the_floor_against_the_peer() -> None:
    runs = {OURS: _side(OURS, [150, 156, 162], 6.8, 3.5, 9.4),
            "protocol floor": _side("protocol floor", [219, 239, 242], 3.1, 2.6, 7.0),
            "Procrastinate": _side("Procrastinate", [266, 269, 290], 3.6, 1.9, 8.0)}
    (line,) = _gap(runs, 2)
    assert f"{156 / 239:.2f}x the protocol floor" in line
    assert f"at {239 / 269:.2f}x Procrastinate" in line
    assert f"would need {1.2 * 269 / 239:.2f}x the floor" in line


def test_a_floor_above_the_goal_is_not_called_out_of_reach() -> None:
    runs = {OURS: _side(OURS, [150], 6.8, 3.5, 9.4), "protocol floor": _side("protocol floor", [400], 3.1, 2.6, 7.0),
            "Procrastinate": _side("Procrastinate", [269], 3.6, 1.9, 8.0)}
    (line,) = _gap(runs, 2)
    assert "would need" not in line


def test_without_the_floor_or_the_peer_nothing_is_said() -> None:
    assert _gap({OURS: _side(OURS, [150], 6.8, 3.5, 9.4)}, 2) == []


def test_the_goal_leaves_a_cpu_budget_per_export_that_the_floor_alone_can_exceed() -> None:
    peer = _side("Procrastinate", [270], 3.6, 1.8, 8.0, cpu_ms=5.95)
    ours = _side(OURS, [162], 6.6, 3.3, 9.7)
    heavy = _side("protocol floor", [248], 3.4, 2.8, 7.0, cpu_ms=6.5)
    (line,) = _gap({OURS: ours, "protocol floor": heavy, "Procrastinate": peer}, 2)
    assert f"at most {2000 / (1.2 * 270):.2f} ms of CPU per export; the floor alone spends 6.50, more than all" in line
    light = _side("protocol floor", [248], 3.0, 2.4, 7.0, cpu_ms=6.02)
    (line,) = _gap({OURS: ours, "protocol floor": light, "Procrastinate": peer}, 2)
    assert f"the floor alone spends 6.02, leaving {2000 / (1.2 * 270) - 6.02:.2f} for the system around" in line
