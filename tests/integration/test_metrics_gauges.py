"""The scheduler's gauges are read from the database on each scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from app import metrics
from app.heartbeat import identity
from app.store import heartbeat
from app.store.database import Database
from app.store.types import Role


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


def test_a_scrape_without_the_database_says_so_instead_of_failing():
    unreachable = Database("postgresql://nobody@127.0.0.1:1/none", Role.APP, min_size=0, max_size=1)
    try:
        assert _scrape(unreachable) == {"exports_database_up": 0.0}
    finally:
        unreachable.close()


def test_a_scrape_counts_active_schedules_the_most_overdue_fire_and_held_slots(app_db, seed, conn, admin):
    import uuid
    from datetime import UTC, datetime, timedelta

    from app.store import schedule
    from app.store.schedule import Decided, RunOutcome, RunTrigger

    tenant_id = seed.tenant()
    overdue, paused = uuid.uuid4(), uuid.uuid4()
    for schedule_id, fire in ((overdue, datetime.now(UTC) - timedelta(minutes=10)),
                              (paused, datetime.now(UTC) - timedelta(hours=5))):
        schedule.add(conn, schedule_id=schedule_id, tenant_id=tenant_id, destination_id=seed.destination(tenant_id),
                     cron="* * * * *", time_zone="UTC", incremental=True, next_fire_at=fire, changed_by="op-1")
    schedule.pause(conn, tenant_id=tenant_id, schedule_id=paused, changed_by="op-1")
    schedule.record_runs(conn, schedule_id=overdue, trigger=RunTrigger.CRON, decided=[
        Decided(datetime(2025, 6, 1), datetime(2025, 6, 1, tzinfo=UTC), RunOutcome.HELD, detail="waiting")])

    samples = _scrape(app_db)

    assert samples["exports_schedules_active"] == 1 and samples["exports_schedule_held_slots"] == 1
    assert 600 <= samples["exports_schedule_overdue_seconds"] < 1200   # the paused one's older fire is not counted
