"""The end-to-end workload's account of the gap to Procrastinate, from the run's own medians."""

from __future__ import annotations

from bench.closed_loop import SideRun
from bench.workloads.end_to_end import OURS, _gap


def _side(name: str, rates: list[float], python_ms: float, postgresql_ms: float, transactions: float) -> list[SideRun]:
    costs = {"cpu_python_ms": python_ms, "cpu_postgresql_ms": postgresql_ms, "transactions": transactions}
    return [SideRun(name, rate, int(rate), 1.0, dict(costs), {}) for rate in rates]


def test_the_gap_splits_into_the_system_over_the_floor_and_the_floor_against_the_peer() -> None:
    runs = {OURS: _side(OURS, [150, 156, 162], 6.8, 3.5, 9.4),
            "protocol floor": _side("protocol floor", [219, 239, 242], 3.1, 2.6, 7.0),
            "Procrastinate": _side("Procrastinate", [266, 269, 290], 3.6, 1.9, 8.0)}
    (line,) = _gap(runs)
    assert f"{156 / 239:.2f}x the protocol floor" in line
    assert f"at {239 / 269:.2f}x Procrastinate" in line
    assert f"would need {1.2 * 269 / 239:.2f}x the floor" in line


def test_a_floor_above_the_goal_is_not_called_out_of_reach() -> None:
    runs = {OURS: _side(OURS, [150], 6.8, 3.5, 9.4), "protocol floor": _side("protocol floor", [400], 3.1, 2.6, 7.0),
            "Procrastinate": _side("Procrastinate", [269], 3.6, 1.9, 8.0)}
    (line,) = _gap(runs)
    assert "would need" not in line


def test_without_the_floor_or_the_peer_nothing_is_said() -> None:
    assert _gap({OURS: _side(OURS, [150], 6.8, 3.5, 9.4)}) == []
