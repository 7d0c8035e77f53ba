"""The deferral's arithmetic and the circuit's decisions, without a database."""

from __future__ import annotations

import pytest

from app.actors.deferral import (
    SESSION_BUSY_SECONDS,
    DeferralPolicy,
    Gate,
    backoff_seconds,
    circuit_wait_seconds,
    decide_circuit,
    session_busy_seconds,
)
from app.store.partner import Circuit


def _open(probe_in: float | None, *, held: bool = False) -> Circuit:
    return Circuit(open=True, probe_in_seconds=probe_in, probe_held=held, failures=1, last_error="refused")


@pytest.mark.parametrize(("deferrals", "ceiling"), [(0, 5.0), (1, 10.0), (2, 20.0), (5, 160.0), (6, 300.0),
                                                   (40, 300.0)])
def test_the_backoff_doubles_with_each_deferral_up_to_the_cap(deferrals, ceiling):
    assert backoff_seconds(deferrals, base=5.0, cap=300.0, rand=lambda: 1.0) == ceiling
    assert backoff_seconds(deferrals, base=5.0, cap=300.0, rand=lambda: 0.0) == ceiling / 2


def test_the_backoff_is_jittered_between_half_and_all_of_its_ceiling():
    draws = [backoff_seconds(3, base=1.0, cap=100.0) for _ in range(200)]

    assert all(4.0 <= d <= 8.0 for d in draws)
    assert len(set(draws)) > 100   # jobs deferred together come back spread out


def test_a_negative_count_backs_off_like_the_first_deferral():
    assert backoff_seconds(-3, base=2.0, cap=10.0, rand=lambda: 1.0) == 2.0


def test_a_busy_destination_is_tried_again_within_about_a_second():
    assert session_busy_seconds(lambda: 0.0) == SESSION_BUSY_SECONDS * 0.25
    assert session_busy_seconds(lambda: 1.0) == SESSION_BUSY_SECONDS
    assert all(0 < session_busy_seconds() <= SESSION_BUSY_SECONDS for _ in range(50))


@pytest.mark.parametrize(("circuit", "gate"), [
    (Circuit.closed(), Gate.GO),
    (_open(12.0), Gate.WAIT),            # the next probe is not due yet
    (_open(0.0), Gate.PROBE),            # due now, nobody holds it
    (_open(-3.0), Gate.PROBE),
    (_open(-3.0, held=True), Gate.WAIT),  # another attempt is probing
    (_open(None), Gate.WAIT),            # open without a probe time: never probed, never passed
], ids=["closed", "open-not-due", "due-now", "overdue", "held-by-another", "no-probe-time"])
def test_the_circuit_lets_an_attempt_go_probe_or_wait(circuit, gate):
    assert decide_circuit(circuit) is gate


def test_an_attempt_turned_away_comes_back_just_after_the_next_probe_is_due():
    policy = DeferralPolicy(base_seconds=2.0, max_seconds=60.0)

    assert circuit_wait_seconds(_open(10.0), policy, rand=lambda: 0.0) == pytest.approx(10.2)
    assert circuit_wait_seconds(_open(10.0), policy, rand=lambda: 1.0) == pytest.approx(11.0)


def test_an_attempt_turned_away_while_another_probes_comes_back_after_a_short_backoff():
    policy = DeferralPolicy(base_seconds=2.0, max_seconds=60.0)

    assert circuit_wait_seconds(_open(-1.0, held=True), policy, rand=lambda: 0.0) == 1.0
    assert circuit_wait_seconds(_open(-1.0, held=True), policy, rand=lambda: 1.0) == 2.0


@pytest.mark.parametrize("changes", [dict(base_seconds=0.0), dict(base_seconds=10.0, max_seconds=5.0),
                                     dict(total_seconds=0.0), dict(probe_seconds=-1.0)])
def test_a_deferral_policy_that_could_not_work_is_refused(changes):
    with pytest.raises(ValueError):
        DeferralPolicy(**changes)
