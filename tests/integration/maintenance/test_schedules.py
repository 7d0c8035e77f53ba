"""The schedules service (`Schedules.run_once`, `run_now`): each (schedule, slot) creates at most one export
however many schedulers run and wherever one dies; a slot missed while every scheduler was down is caught up
once within the grace and recorded Missed past it; DST as APScheduler computes it, checked at fixed
instants; pausing or removing never touches an export already created; an incremental schedule's next run
waits for the last one to settle."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.maintenance.cron import Cron
from app.maintenance.schedules import CREATED_BY, RunNowReply, ScheduleConfig, ScheduleCounts, Schedules, run_now
from app.store import export, schedule
from app.store.database import Database
from app.store.types import FailureCode, Role, Status
from exports_devtools.waiting import wait_until
from tests.factories import Job

GRACE = ScheduleConfig(grace_seconds=3600)


def add(seed, cron="0 2 * * *", zone="Europe/Berlin", *, starting: datetime, incremental=False, tenant_id=None):
    tenant_id = tenant_id or seed.tenant()
    destination_id = seed.destination(tenant_id)
    schedule_id = uuid.uuid4()
    first = Cron.parse(cron, zone).first_at_or_after(starting)
    assert schedule.add(seed.conn, schedule_id=schedule_id, tenant_id=tenant_id, destination_id=destination_id,
                        cron=cron, time_zone=zone, incremental=incremental, next_fire_at=first,
                        changed_by="op-1") is schedule.AddResult.ADDED
    return schedule_id, tenant_id, destination_id


def runs(admin, schedule_id) -> list[dict]:
    return admin.execute("SELECT * FROM schedule_runs WHERE schedule_id = %s ORDER BY slot", (schedule_id,)).fetchall()


def exports_of(admin, schedule_id) -> list[dict]:
    return admin.execute("SELECT * FROM export_jobs WHERE schedule_id = %s ORDER BY created_at",
                         (schedule_id,)).fetchall()


def next_fire(admin, schedule_id):
    return admin.execute("SELECT next_fire_at FROM schedules WHERE id = %s", (schedule_id,)).fetchone()["next_fire_at"]


def as_job(row) -> Job:
    return Job(row["id"], row["tenant_id"], row["destination_id"], row["delivery_key"])


# --- DST, at fixed instants ---------------------------------------------------------------------


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("starting", "fires", "slots"), [
    # 02:00 does not exist on 30 March: APScheduler fires at the jump, 01:00 UTC, which is 03:00 CEST.
    (utc("2025-03-28T12:00"), ["2025-03-29T01:00", "2025-03-30T01:00", "2025-03-31T00:00"],
     ["2025-03-29 02:00", "2025-03-30 03:00", "2025-03-31 02:00"]),
    # 02:00 happens twice on 26 October: APScheduler fires at both (00:00 and 01:00 UTC); one slot runs.
    (utc("2025-10-24T12:00"), ["2025-10-25T00:00", "2025-10-26T00:00", "2025-10-26T01:00", "2025-10-27T01:00"],
     ["2025-10-25 02:00", "2025-10-26 02:00", "2025-10-27 02:00"]),
], ids=["clocks-forward", "clocks-back"])
def test_a_dst_change_in_berlin_runs_each_local_0200_once(seed, app_db, admin, starting, fires, slots):
    schedule_id, *_ = add(seed, starting=starting)
    service = Schedules(app_db, GRACE)
    computed = Cron.parse("0 2 * * *", "Europe/Berlin").upcoming(starting, len(fires))
    assert [f.astimezone(UTC) for f in computed] == [utc(f) for f in fires]   # APScheduler's computation

    for fire in fires:
        assert next_fire(admin, schedule_id) == utc(fire)
        service.run_once(as_of=utc(fire) + timedelta(seconds=1))

    recorded = runs(admin, schedule_id)
    assert [(f"{r['slot']:%Y-%m-%d %H:%M}", r["outcome"]) for r in recorded] == [(s, "Created") for s in slots]
    first_fire_of_each_slot = [f for f in fires if f != "2025-10-26T01:00"]
    assert [r["fire_at"] for r in recorded] == [utc(f) for f in first_fire_of_each_slot]
    assert sorted(e["schedule_slot"] for e in exports_of(admin, schedule_id)) == [r["slot"] for r in recorded]


# --- one export per slot ----------------------------------------------------------------------------


def test_a_due_slot_creates_its_export_with_the_schedule_and_slot_recorded_and_a_later_pass_adds_nothing(
        seed, app_db, admin):
    starting = datetime(2025, 6, 1, tzinfo=UTC)
    schedule_id, tenant_id, destination_id = add(seed, starting=starting)
    fire = next_fire(admin, schedule_id)
    service = Schedules(app_db, GRACE)

    assert service.run_once(as_of=fire + timedelta(seconds=5)) == ScheduleCounts(due=1, created=1)
    assert service.run_once(as_of=fire + timedelta(seconds=6)) == ScheduleCounts()

    [run] = runs(admin, schedule_id)
    [job] = exports_of(admin, schedule_id)
    assert (run["outcome"], run["job_id"], run["trigger"], run["fire_at"]) == ("Created", job["id"], "Cron", fire)
    assert (job["status"], job["schedule_slot"], job["tenant_id"], job["destination_id"], job["created_by"]) == (
        "Queued", datetime(2025, 6, 1, 2, 0), tenant_id, destination_id, CREATED_BY)
    assert len(admin.execute("SELECT * FROM outbox WHERE job_id = %s", (job["id"],)).fetchall()) == 1
    assert next_fire(admin, schedule_id) == fire + timedelta(days=1)


def test_two_schedulers_racing_the_same_slot_create_one_export(seed, db_url, pg_proxy, admin, threads):
    schedule_id, *_ = add(seed, starting=datetime(2025, 6, 1, tzinfo=UTC))
    as_of = next_fire(admin, schedule_id) + timedelta(seconds=1)
    # Scheduler A has moved the schedule on and stops before recording the slot: it holds the row's lock.
    hold = pg_proxy.hold_statement("schedule_record_runs")
    with Database(pg_proxy.url, Role.APP, max_size=2, name="scheduler-a") as a_db, \
            Database(db_url, Role.APP, max_size=2, name="scheduler-b") as b_db:
        a = threads.submit(Schedules(a_db, GRACE).run_once, as_of=as_of)
        assert hold.reached.wait(60)
        b = threads.submit(Schedules(b_db, GRACE).run_once, as_of=as_of)
        # B read the same fire time and waits on A's row lock.
        wait_until(lambda: admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'scheduler-b' AND wait_event_type = 'Lock'"
        ).fetchone(), "scheduler B to wait on the schedule's row lock")
        hold.release()
        counts = [a.result(timeout=10), b.result(timeout=10)]

    assert sorted((c.created, c.raced) for c in counts) == [(0, 1), (1, 0)]
    assert len(exports_of(admin, schedule_id)) == 1 and len(runs(admin, schedule_id)) == 1


def test_schedulers_running_passes_at_once_over_many_slots_create_one_export_per_slot(seed, app_db, db_url, admin,
                                                                                      threads):
    starting = datetime(2025, 6, 1, tzinfo=UTC)
    schedule_id, *_ = add(seed, "*/10 * * * *", "UTC", starting=starting)
    fires = Cron.parse("*/10 * * * *", "UTC").upcoming(starting, 12)
    with Database(db_url, Role.APP, max_size=2) as other_db:
        services = [Schedules(app_db, GRACE), Schedules(other_db, GRACE)]
        for fire in fires:
            passes = [threads.submit(s.run_once, as_of=fire + timedelta(seconds=1)) for s in services]
            assert sum(p.result(timeout=30).created for p in passes) == 1

    assert len(exports_of(admin, schedule_id)) == len(fires) == len(runs(admin, schedule_id))
    assert {e["schedule_slot"] for e in exports_of(admin, schedule_id)} == {f.replace(tzinfo=None) for f in fires}


def test_a_scheduler_cut_off_before_its_commit_leaves_the_slot_to_the_next_pass_which_creates_it_once(
        seed, pg_proxy, app_db, admin):
    schedule_id, *_ = add(seed, starting=datetime(2025, 6, 1, tzinfo=UTC))
    as_of = next_fire(admin, schedule_id) + timedelta(seconds=1)
    cut = pg_proxy.cut_at_commit("schedule_record_runs", after_reply=False)
    with Database(pg_proxy.url, Role.APP, max_size=2) as dying:
        assert Schedules(dying, GRACE).run_once(as_of=as_of).errors == 1
    cut.wait()
    assert exports_of(admin, schedule_id) == [] and runs(admin, schedule_id) == []

    assert Schedules(app_db, GRACE).run_once(as_of=as_of + timedelta(seconds=30)).created == 1
    assert len(exports_of(admin, schedule_id)) == 1


def test_a_scheduler_that_never_hears_its_commit_leaves_the_slot_decided_and_no_pass_duplicates_it(
        seed, pg_proxy, app_db, admin):
    schedule_id, *_ = add(seed, starting=datetime(2025, 6, 1, tzinfo=UTC))
    as_of = next_fire(admin, schedule_id) + timedelta(seconds=1)
    cut = pg_proxy.cut_at_commit("schedule_record_runs")
    with Database(pg_proxy.url, Role.APP, max_size=2) as dying:
        assert Schedules(dying, GRACE).run_once(as_of=as_of).errors == 1
    cut.wait()

    assert Schedules(app_db, GRACE).run_once(as_of=as_of + timedelta(seconds=30)) == ScheduleCounts()
    assert len(exports_of(admin, schedule_id)) == 1 and len(runs(admin, schedule_id)) == 1


# --- catching up -----------------------------------------------------------------------------------


def test_a_slot_missed_while_every_scheduler_was_down_is_caught_up_once_within_the_grace(seed, app_db, admin):
    schedule_id, *_ = add(seed, starting=datetime(2025, 6, 1, tzinfo=UTC))
    fire = next_fire(admin, schedule_id)
    service = Schedules(app_db, GRACE)

    assert service.run_once(as_of=fire + timedelta(minutes=59)).created == 1
    assert service.run_once(as_of=fire + timedelta(minutes=61)) == ScheduleCounts()

    [run] = runs(admin, schedule_id)
    assert run["outcome"] == "Created" and run["fire_at"] == fire


def test_a_slot_older_than_the_grace_is_recorded_missed_not_run(seed, app_db, admin):
    schedule_id, *_ = add(seed, starting=datetime(2025, 6, 1, tzinfo=UTC))
    fire = next_fire(admin, schedule_id)

    counts = Schedules(app_db, GRACE).run_once(as_of=fire + timedelta(hours=2))

    assert counts == ScheduleCounts(due=1, missed=1)
    [run] = runs(admin, schedule_id)
    assert run["outcome"] == "Missed" and run["job_id"] is None and "older than the grace" in run["detail"]
    assert exports_of(admin, schedule_id) == []


def test_several_slots_missed_at_once_run_the_latest_and_record_the_others_as_folded_into_it(seed, app_db, admin):
    starting = datetime(2025, 6, 1, tzinfo=UTC)
    schedule_id, *_ = add(seed, "*/10 * * * *", "UTC", starting=starting)

    counts = Schedules(app_db, GRACE).run_once(as_of=starting + timedelta(minutes=35))

    assert counts == ScheduleCounts(due=1, created=1, missed=3)
    recorded = runs(admin, schedule_id)
    assert [(f"{r['slot']:%H:%M}", r["outcome"]) for r in recorded] == [
        ("00:00", "Missed"), ("00:10", "Missed"), ("00:20", "Missed"), ("00:30", "Created")]
    assert all("folded into the later slot" in r["detail"] for r in recorded[:3])
    assert next_fire(admin, schedule_id) == starting + timedelta(minutes=40)


# --- pause, resume, remove ----------------------------------------------------------------------------


def test_pausing_or_removing_a_schedule_stops_its_slots_and_never_touches_an_export_it_created(seed, app_db, admin):
    starting = datetime(2025, 6, 1, tzinfo=UTC)
    schedule_id, tenant_id, _ = add(seed, "*/10 * * * *", "UTC", starting=starting)
    service = Schedules(app_db, GRACE)
    service.run_once(as_of=starting + timedelta(seconds=1))
    [job] = exports_of(admin, schedule_id)

    assert schedule.pause(seed.conn, tenant_id=tenant_id, schedule_id=schedule_id, changed_by="op-1")
    assert service.run_once(as_of=starting + timedelta(minutes=10, seconds=1)) == ScheduleCounts()
    assert not schedule.pause(seed.conn, tenant_id=tenant_id, schedule_id=schedule_id, changed_by="op-1")
    assert schedule.remove(seed.conn, tenant_id=tenant_id, schedule_id=schedule_id, changed_by="op-2")
    assert not schedule.resume(seed.conn, tenant_id=tenant_id, schedule_id=schedule_id, next_fire_at=None,
                               changed_by="op-1")

    assert [(e["id"], e["status"]) for e in exports_of(admin, schedule_id)] == [(job["id"], "Queued")]
    assert len(runs(admin, schedule_id)) == 1
    row = admin.execute("SELECT * FROM schedules WHERE id = %s", (schedule_id,)).fetchone()
    assert (row["state"], row["next_fire_at"], row["changed_by"]) == ("Removed", None, "op-2")


def test_a_schedule_of_another_tenant_is_neither_paused_nor_run_now(seed, admin, conn):
    schedule_id, *_ = add(seed, starting=datetime(2025, 6, 1, tzinfo=UTC))
    other = seed.tenant("Other")

    assert not schedule.pause(conn, tenant_id=other, schedule_id=schedule_id, changed_by="op-1")
    assert run_now(conn, tenant_id=other, schedule_id=schedule_id, requested_by="op-1").reply is RunNowReply.NOT_FOUND
    assert exports_of(admin, schedule_id) == []


# --- run now ------------------------------------------------------------------------------------------


def test_run_now_creates_an_export_in_a_slot_of_its_own_by_the_operator(seed, admin, conn):
    schedule_id, tenant_id, _ = add(seed, starting=datetime(2030, 1, 1, tzinfo=UTC))

    result = run_now(conn, tenant_id=tenant_id, schedule_id=schedule_id, requested_by="op-1")

    assert result.reply is RunNowReply.CREATED
    [job] = exports_of(admin, schedule_id)
    [run] = runs(admin, schedule_id)
    assert (job["id"], job["created_by"], job["schedule_slot"]) == (result.job_id, "op-1", result.slot)
    assert (run["trigger"], run["outcome"], run["job_id"]) == ("RunNow", "Created", result.job_id)


# --- incremental: runs take turns -----------------------------------------------------------------------


def test_an_incremental_schedules_next_slot_is_held_while_its_last_run_is_unsettled_and_runs_once_it_is(
        seed, app_db, admin, conn):
    starting = datetime(2025, 6, 1, tzinfo=UTC)
    schedule_id, tenant_id, _ = add(seed, "*/10 * * * *", "UTC", starting=starting, incremental=True)
    service = Schedules(app_db, GRACE)
    service.run_once(as_of=starting + timedelta(seconds=1))
    [first] = exports_of(admin, schedule_id)
    assert first["incremental"] and first["incremental_since"] is None   # the first run sends everything
    first_job = seed.finished(Status.OUTCOME_UNKNOWN, as_job(first))

    # Two more slots while it is OutcomeUnknown: the first is held, the next folded into it.
    assert service.run_once(as_of=starting + timedelta(minutes=10, seconds=1)).held == 1
    assert service.run_once(as_of=starting + timedelta(minutes=20, seconds=1)).missed == 1
    assert run_now(conn, tenant_id=tenant_id, schedule_id=schedule_id, requested_by="op-1").reply is RunNowReply.HELD
    assert len(exports_of(admin, schedule_id)) == 1
    held = [r for r in runs(admin, schedule_id) if r["outcome"] == "Held"]
    assert len(held) == 1 and str(first["id"]) in held[0]["detail"]

    # Settled: reconciled Completed. The held slot is created by the next pass, and only then.
    assert export.reconcile(conn, tenant_id=tenant_id, job_id=first_job.id, attempt_id=first_job.attempt_id,
                            resolution=Status.COMPLETED, evidence="partner confirmed", reconciled_by="op-1")
    assert service.run_once(as_of=starting + timedelta(minutes=21)).released == 1
    assert service.run_once(as_of=starting + timedelta(minutes=22)) == ScheduleCounts()
    second = exports_of(admin, schedule_id)[1]
    assert second["schedule_slot"] == held[0]["slot"] and second["incremental"]
    assert [r["outcome"] for r in runs(admin, schedule_id)] == ["Created", "Created", "Missed"]


def test_an_incremental_run_that_failed_does_not_hold_the_next_one(seed, app_db, admin):
    starting = datetime(2025, 6, 1, tzinfo=UTC)
    schedule_id, *_ = add(seed, "*/10 * * * *", "UTC", starting=starting, incremental=True)
    service = Schedules(app_db, GRACE)
    service.run_once(as_of=starting + timedelta(seconds=1))
    [first] = exports_of(admin, schedule_id)
    seed.finished(Status.FAILED, as_job(first), failure_reason=FailureCode.NOT_DELIVERED)

    assert service.run_once(as_of=starting + timedelta(minutes=10, seconds=1)).created == 1
    assert len(exports_of(admin, schedule_id)) == 2

