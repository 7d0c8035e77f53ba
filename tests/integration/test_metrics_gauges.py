"""The scheduler's gauges are read from the database on each scrape."""

from __future__ import annotations

import uuid

from prometheus_client import CollectorRegistry, generate_latest

from app import metrics
from app.heartbeat import identity
from app.store import heartbeat, webhooks
from app.store.database import Database
from app.store.types import Role, Status


def _scrape(db) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(metrics.DatabaseGauges(db, silent_seconds=30))
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_a_scrape_counts_jobs_by_status_the_backlog_and_live_processes(app_db, seed, conn):
    seed.queued()
    seed.expire_lease(seed.running())
    heartbeat.beat(conn, identity("relay"))

    samples = _scrape(app_db)

    assert samples["exports_database_up"] == 1
    assert samples['exports_jobs{status="Queued"}'] == 1 and samples['exports_jobs{status="Running"}'] == 1
    assert samples["exports_outbox_unpublished"] == 2 and samples["exports_expired_leases"] == 1
    assert samples["exports_queued_oldest_wait_seconds"] >= 0
    assert samples['exports_live_processes{role="relay"}'] == 1
    assert samples['exports_live_processes{role="worker"}'] == 0


def test_a_scrape_counts_the_webhook_events_owed_and_given_up(app_db, seed, conn, admin):
    tenant = seed.tenant()
    webhooks.add_endpoint(conn, endpoint_id=uuid.uuid4(), endpoint=webhooks.NewEndpoint(
        tenant_id=tenant, name="prod", url="https://hooks.example/in", secret_ref="env:HOOK", created_by="t"))
    for _ in range(3):
        seed.finished(Status.COMPLETED, seed.queued(tenant))
    admin.execute("UPDATE webhook_deliveries SET state = 'dead', finished_at = clock_timestamp() "
                  "WHERE id = (SELECT min(id::text)::uuid FROM webhook_deliveries)")

    samples = _scrape(app_db)

    assert samples["exports_webhook_pending"] == 2 and samples["exports_webhook_dead"] == 1
    assert samples["exports_webhook_oldest_pending_seconds"] >= 0
    assert samples["exports_webhook_late_endpoints"] == 0


def test_a_scrape_without_the_database_says_so_instead_of_failing():
    unreachable = Database("postgresql://nobody@127.0.0.1:1/none", Role.APP, min_size=0, max_size=1)
    try:
        assert _scrape(unreachable) == {"exports_database_up": 0.0}
    finally:
        unreachable.close()
