"""Per-export costs from two meter readings, and the closed loop's load generator, with no database."""

from __future__ import annotations

import threading

import pytest

from bench import closed_loop, meter


def _reading(at: float, **values) -> meter.Reading:
    base = dict(at=at, cpu={}, transactions=0, other_transactions=0, wal_syncs=0, wal_bytes=0, ssh_logins=None,
                redis_commands=None, machine=(0, 0))
    return meter.Reading(**{**base, **values})


def test_costs_per_export_are_the_deltas_over_the_exports_without_the_load_generators_polls():
    before = _reading(10.0, cpu={"python": 1.0, "postgresql": 2.0, "sshd": 0.5}, transactions=1000,
                      other_transactions=50, wal_syncs=100, wal_bytes=1_000_000, ssh_logins=4, redis_commands=500,
                      machine=(100, 400))
    after = _reading(20.0, cpu={"python": 3.0, "postgresql": 3.0, "sshd": 0.7}, transactions=3600,
                     other_transactions=71, wal_syncs=350, wal_bytes=1_000_000 + 100 * 2048, ssh_logins=9,
                     redis_commands=2101, machine=(900, 1400))
    costs = meter.per_export(before, after, 100, generator_transactions=600)

    assert costs["cpu_python_ms"] == pytest.approx(20.0)
    assert costs["cpu_postgresql_ms"] == pytest.approx(10.0)
    assert costs["cpu_sshd_ms"] == pytest.approx(2.0)
    assert "cpu_redis_ms" not in costs   # no redis-server to read: not reported, not zero
    assert costs["cpu_ms"] == pytest.approx(32.0)
    assert costs["transactions"] == pytest.approx(20.0)   # (2600 - 600 polls) / 100
    assert costs["wal_syncs"] == pytest.approx(2.5)
    assert costs["wal_kib"] == pytest.approx(2.0)
    assert costs["ssh_logins"] == pytest.approx(0.05)
    assert costs["redis_commands"] == pytest.approx(16.0)   # 1601 less the earlier reading's INFO
    assert costs["machine_busy"] == pytest.approx(0.8)
    assert costs["other_transactions_per_s"] == pytest.approx(2.0)   # 21 less the meter's own reading, over 10 s


def test_a_window_with_no_export_has_no_cost_per_export_and_missing_counters_are_not_a_number():
    before, after = _reading(0.0), _reading(1.0)
    assert meter.per_export(before, after, 0) == {}
    costs = meter.per_export(before, after, 10)
    assert costs["ssh_logins"] != costs["ssh_logins"] and costs["redis_commands"] != costs["redis_commands"]


def test_the_idle_rates_are_per_second_of_the_window():
    rates = meter.per_second(_reading(0.0, cpu={"python": 1.0}, transactions=10, redis_commands=100,
                                      other_transactions=7, wal_bytes=0),
                             _reading(4.0, cpu={"python": 1.2}, transactions=30, redis_commands=181,
                                      other_transactions=16, wal_bytes=8192))
    assert rates == pytest.approx({"cpu_python_ms": 50.0, "transactions": 5.0, "wal_syncs": 0.0, "wal_kib": 2.0,
                                   "other_transactions": 2.0, "redis_commands": 20.0})


def test_logins_are_the_lines_of_accepted_authentications():
    log = ("Server listening on 127.0.0.1 port 40000.\n"
           "Accepted publickey for root from 127.0.0.1 port 1 ssh2: ED25519 SHA256:x\n"
           "Connection reset by 127.0.0.1 port 2\n"
           "Accepted publickey for root from 127.0.0.1 port 3 ssh2: ED25519 SHA256:x\n")
    assert meter.count_logins(log) == 2


def test_drift_compares_the_rate_of_the_last_third_with_the_first():
    steady = [(t / 2, 10 * t) for t in range(0, 19)]   # 20 exports/s for 9 s
    assert closed_loop.drift(steady, 9.0) == pytest.approx(0.0)
    slowing = [(float(t), (20 * t) if t <= 3 else 60 + 10 * (t - 3)) for t in range(0, 10)]
    assert closed_loop.drift(slowing, 9.0) == pytest.approx(0.5)


class _HeldQueue:
    """Ends nothing until ``release`` is set, then ends every job it is asked about; counts its calls."""

    def __init__(self, backlog: int) -> None:
        self.backlog = backlog
        self.submitted = 0
        self.calls = 0
        self.largest_ask = 0
        self.full = threading.Event()
        self.release = threading.Event()
        self.closed = False

    def submit(self) -> int:
        self.submitted += 1
        return self.submitted

    def ended(self, ids: list) -> dict:
        self.calls += 1
        self.largest_ask = max(self.largest_ask, len(ids))
        if len(ids) == self.backlog:
            self.full.set()
        if not self.release.is_set():
            return {}
        return {job: "Completed" if job % 2 else "Failed" for job in ids}

    def close(self) -> None:
        self.closed = True


def test_the_generator_keeps_its_backlog_outstanding_and_counts_only_the_exports_that_ended_well():
    queue = _HeldQueue(backlog=3)
    generator = closed_loop.Generator(queue, backlog=3).start()
    assert queue.full.wait(5)
    # Nothing has ended: it created its backlog and no more.
    assert queue.submitted == 3 and generator.completed == 0
    queue.release.set()
    statuses = generator.stop()

    assert queue.largest_ask == 3
    assert sum(statuses.values()) == len(generator.created) == queue.submitted
    assert generator.completed == statuses.get("Completed", 0) > 0
    assert generator.polls == queue.calls   # every poll is a transaction the meter takes off
    assert queue.closed
