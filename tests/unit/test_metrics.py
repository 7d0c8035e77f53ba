"""Metrics served per process: addresses, and what a maintenance run adds to its counters."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from app import metrics
from app.maintenance.sweeper import SweepCounts


@pytest.mark.parametrize("address, parsed", [
    ("127.0.0.1:9461", ("127.0.0.1", 9461)),
    (":9462", ("127.0.0.1", 9462)),
    ("[::1]:9463", ("::1", 9463)),
    ("off", None),
])
def test_a_metrics_address_is_host_and_port_or_off(address, parsed):
    assert metrics.parse_address(address) == parsed


@pytest.mark.parametrize("address", ["9461", "localhost:http", "127.0.0.1:70000", ""])
def test_a_malformed_metrics_address_is_refused_with_its_text(address):
    with pytest.raises(ValueError, match="host:port or off"):
        metrics.parse_address(address)


def test_a_maintenance_run_adds_its_nonzero_counts_by_service():
    def value(count: str) -> float:
        return REGISTRY.get_sample_value("exports_maintenance_total", {"service": "sweeper", "count": count}) or 0.0

    before = value("republished")
    metrics.count_run("sweeper", SweepCounts(republished=3, batches=1))

    assert value("republished") == before + 3


def test_the_first_use_of_a_family_by_many_threads_at_once_builds_it_once(monkeypatch):
    import threading

    monkeypatch.setattr(metrics, "_built", {})
    built = []

    class Family:
        def __init__(self):
            built.append(self)
            entered.wait(5)   # every thread is inside _once before the first finishes building

    entered = threading.Event()
    threads = [threading.Thread(target=metrics._once, args=(Family,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    entered.set()
    for thread in threads:
        thread.join(5)

    assert len(built) == 1
