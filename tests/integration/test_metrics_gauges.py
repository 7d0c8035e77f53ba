"""The scheduler's gauges are read from the database on each scrape: every status and failure code present,
0 when no job has it, so a rule always has a series to compare."""

from __future__ import annotations

import uuid

from prometheus_client import CollectorRegistry, generate_latest

from app import metrics
from app.heartbeat import identity
from app.store import heartbeat, partner, pausing, webhooks
from app.store.database import Database
from app.store.types import FailureCode, Role, Status
from tests.factories_more import States


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


def test_every_status_and_every_failure_code_is_served_zero_when_no_job_has_it(app_db, seed):
    States(seed).failed(FailureCode.BUILD_FAILED)
    States(seed).failed(FailureCode.ATTEMPTS_EXHAUSTED)
    States(seed).failed(FailureCode.ATTEMPTS_EXHAUSTED)

    samples = _scrape(app_db)

    assert {s: samples[f'exports_jobs{{status="{s}"}}'] for s in Status} == {
        s: (3 if s is Status.FAILED else 0) for s in Status}
    assert {c: samples[f'exports_failed_jobs{{code="{c}"}}'] for c in FailureCode} == {
        c: {FailureCode.BUILD_FAILED: 1, FailureCode.ATTEMPTS_EXHAUSTED: 2}.get(c, 0) for c in FailureCode}


def test_a_destination_whose_circuit_opened_is_counted_until_it_closes_and_republications_are_served(
        app_db, seed, conn):
    destination = seed.destination(seed.tenant())
    assert _scrape(app_db)["exports_open_circuits"] == 0
    opened = partner.record_failure(conn, destination_id=destination, attempt_id=uuid.uuid4(),
                                    error="connecting: refused", base_seconds=1, max_seconds=10)
    assert opened.opened
    assert _scrape(app_db)["exports_open_circuits"] == 1
    assert partner.close_circuit(conn, destination_id=destination)
    assert _scrape(app_db)["exports_open_circuits"] == 0

    job = seed.queued()
    conn.execute("UPDATE export_jobs SET sweep_count = 4 WHERE id = %s", (job.id,))
    assert _scrape(app_db)["exports_queued_max_sweeps"] == 4


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


def test_exports_held_by_a_pause_are_counted_apart_from_the_oldest_wait(app_db, seed, conn):
    held = seed.queued()
    seed.age_wakeup(held, minutes=120)
    waiting = seed.queued()
    assert pausing.pause_destination(conn, tenant_id=held.tenant_id, destination_id=held.destination_id,
                                     changed_by="ops-alice", reason=None)

    samples = _scrape(app_db)

    assert samples["exports_held_jobs"] == 1
    # The held export waited two hours for a person, not for a worker: the queue is not stalled.
    assert samples["exports_queued_oldest_wait_seconds"] < 3600
    assert pausing.pause_tenant(conn, tenant_id=waiting.tenant_id, changed_by="ops-alice", reason=None)
    assert _scrape(app_db)["exports_held_jobs"] == 2
