"""``exports schedule`` run as the real console script: add, list, show (with recent runs and why an
incremental schedule waits), pause, resume, remove, run-now; bad input answers one line and changes nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_REFUSED
from app.maintenance.schedules import ScheduleConfig, Schedules
from app.store.types import Status
from tests.acceptance.test_cli import Tenant, grant, one_line_error, snapshot
from tests.factories import Job

ADD = ("schedule", "add", "--tenant", "Initech", "--destination", "partner", "--by", "alice")


@pytest.fixture
def tenant(seed, conn) -> Tenant:
    """Tenant 'Initech' with one destination, 'partner', and operator 'alice' granted for it."""
    tenant_id = seed.tenant("Initech")
    destination_id = seed.destination(tenant_id)
    grant(conn, tenant_id, "alice")
    return Tenant(tenant_id, destination_id)


def test_schedule_add_records_an_active_schedule_and_prints_its_next_fire_times(exports_cli, admin, tenant):
    added = exports_cli(*ADD, "--cron", "0 2 * * *", "--timezone", "Europe/Berlin", "--json").json
    text = exports_cli(*ADD, "--cron", "30 6 * * mon-fri", "--timezone", "UTC", "--incremental").stdout

    row = admin.execute("SELECT * FROM schedules WHERE id = %s", (added["schedule_id"],)).fetchone()
    assert (row["state"], row["cron"], row["time_zone"], row["incremental"], row["created_by"]) == (
        "Active", "0 2 * * *", "Europe/Berlin", False, "alice")
    assert row["next_fire_at"] == datetime.fromisoformat(added["next_fires"][0])
    assert len(added["next_fires"]) == 3
    assert "incremental schedule" in text and "06:30:00 UTC" in text
    listed = exports_cli("schedule", "list", "--tenant", "Initech").stdout
    assert added["schedule_id"] in listed and "incremental" in listed


@pytest.mark.parametrize(("cron", "zone", "why"), [
    ("0 2 * * 1", "Europe/Berlin", "name the days of the week"),
    ("0 2 * *", "Europe/Berlin", "five fields"),
    ("0 25 * * *", "Europe/Berlin", "not a cron expression"),
    ("0 2 * * *", "Mars/Olympus", "unknown time zone"),
], ids=["numeric-day-of-week", "four-fields", "hour-25", "unknown-zone"])
def test_schedule_add_refuses_what_apscheduler_cannot_use_in_one_line_and_changes_nothing(
        exports_cli, admin, tenant, cron, zone, why):
    before = snapshot(admin)

    result = exports_cli(*ADD, "--cron", cron, "--timezone", zone, expect=EXIT_BAD_INPUT)

    one_line_error(result)
    assert why in result.stderr
    assert snapshot(admin) == before


def test_schedule_add_by_an_operator_without_a_grant_is_refused(exports_cli, admin, tenant):
    before = snapshot(admin)
    result = exports_cli("schedule", "add", "--tenant", "Initech", "--destination", "partner", "--by", "mallory",
                         "--cron", "0 2 * * *", "--timezone", "UTC", expect=EXIT_REFUSED)
    one_line_error(result)
    assert snapshot(admin) == before


def test_pause_resume_and_remove_change_the_state_once_and_say_why_not_after(exports_cli, admin, tenant):
    schedule_id = exports_cli(*ADD, "--cron", "0 2 * * *", "--timezone", "UTC", "--json").json["schedule_id"]
    verb = ("--tenant", "Initech", "--by", "alice")

    exports_cli("schedule", "pause", schedule_id, *verb)
    again = exports_cli("schedule", "pause", schedule_id, *verb, expect=EXIT_REFUSED)
    one_line_error(again)
    assert "is Paused" in again.stderr
    exports_cli("schedule", "resume", schedule_id, *verb)
    assert admin.execute("SELECT next_fire_at FROM schedules WHERE id = %s",
                         (schedule_id,)).fetchone()["next_fire_at"] > datetime.now(UTC)
    exports_cli("schedule", "remove", schedule_id, *verb)
    one_line_error(exports_cli("schedule", "resume", schedule_id, *verb, expect=EXIT_REFUSED))
    assert admin.execute("SELECT state FROM schedules WHERE id = %s", (schedule_id,)).fetchone()["state"] == "Removed"


def test_another_tenants_schedule_answers_like_a_missing_one(exports_cli, admin, seed, tenant):
    schedule_id = exports_cli(*ADD, "--cron", "0 2 * * *", "--timezone", "UTC", "--json").json["schedule_id"]
    other = seed.tenant("Other")
    grant(seed.conn, other, "alice")
    before = snapshot(admin)

    results = [exports_cli("schedule", "run-now", str(sid), "--tenant", "Other", "--by", "alice",
                           expect=EXIT_NOT_FOUND) for sid in (schedule_id, uuid.uuid4())]

    for result in results:
        one_line_error(result)
    assert snapshot(admin) == before


def test_run_now_queues_an_export_that_show_prints_with_its_schedule_and_slot(exports_cli, admin, tenant):
    schedule_id = exports_cli(*ADD, "--cron", "0 2 * * *", "--timezone", "Europe/Berlin", "--json").json["schedule_id"]

    created = exports_cli("schedule", "run-now", schedule_id, "--tenant", "Initech", "--by", "alice", "--json").json

    shown = exports_cli("show", created["job_id"], "--tenant", "Initech").stdout
    assert f"schedule {schedule_id}  slot {created['slot'][:10]}" in shown
    runs = exports_cli("schedule", "show", schedule_id, "--tenant", "Initech").stdout
    assert created["job_id"] in runs and "RunNow" in runs and "Queued" in runs


def test_schedule_show_says_an_incremental_schedules_next_run_waits_for_an_outcome_unknown_export(
        exports_cli, admin, seed, tenant, app_db):
    starting = datetime.now(UTC) - timedelta(minutes=1)
    schedule_id = exports_cli(*ADD, "--cron", "* * * * *", "--timezone", "UTC", "--incremental", "--starting",
                              starting.isoformat(), "--json").json["schedule_id"]
    service = Schedules(app_db, ScheduleConfig(grace_seconds=3600))
    service.run_once()
    first = admin.execute("SELECT * FROM export_jobs WHERE schedule_id = %s", (schedule_id,)).fetchone()
    seed.finished(Status.OUTCOME_UNKNOWN, Job(first["id"], first["tenant_id"], first["destination_id"],
                                              first["delivery_key"]))
    service.run_once(as_of=datetime.now(UTC) + timedelta(minutes=2))

    shown = exports_cli("schedule", "show", schedule_id, "--tenant", "Initech").stdout
    held = exports_cli("schedule", "run-now", schedule_id, "--tenant", "Initech", "--by", "alice",
                       expect=EXIT_REFUSED)

    assert "HELD" in shown and str(first["id"]) in shown and "OutcomeUnknown" in shown and "reconcile" in shown
    assert "Held" in shown and "Created" in shown
    one_line_error(held)
    assert "must settle first" in held.stderr


def test_list_shows_which_schedule_made_an_export_and_lists_one_schedules_exports(exports_cli, seed, tenant):
    schedule_id = exports_cli(*ADD, "--cron", "0 2 * * *", "--timezone", "UTC", "--json").json["schedule_id"]
    scheduled = exports_cli("schedule", "run-now", schedule_id, "--tenant", "Initech", "--by", "alice",
                            "--json").json["job_id"]
    by_hand = str(seed.queued(tenant.id, tenant.destination_id).id)

    listed = {row["job_id"]: row["schedule_id"] for row in exports_cli("list", "--tenant", "Initech", "--json").json}
    text = exports_cli("list", "--tenant", "Initech").stdout
    only = exports_cli("list", "--tenant", "Initech", "--schedule", schedule_id, "--json").json

    assert listed == {scheduled: schedule_id, by_hand: None}
    assert "schedule" in text.splitlines()[0] and schedule_id[:8] in text
    assert [row["job_id"] for row in only] == [scheduled]


@pytest.mark.parametrize("argv, code, said", [
    (("--schedule", str(uuid.UUID(int=5))), EXIT_BAD_INPUT, "--schedule needs --tenant"),
    (("--tenant", "Initech", "--schedule", str(uuid.UUID(int=5))), EXIT_NOT_FOUND, "no schedule"),
    (("--tenant", "Initech", "--schedule", "nightly"), EXIT_BAD_INPUT, "not a UUID"),
])
def test_list_by_a_missing_or_malformed_schedule_is_one_line_with_its_exit_code(exports_cli, tenant, argv, code, said):
    result = exports_cli("list", *argv, expect=code)

    one_line_error(result)
    assert said in result.stderr
