"""The chaos checker's ``slot-not-once`` rule, on slots made up to break it one way each (the database's own
keys refuse most of these, so only made-up rows can show the rule sees them)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from exports_devtools.chaos.slots import RULE, slot_violations
from exports_devtools.store.chaos import Slots

SCHEDULE = uuid.uuid4()
START = datetime(2025, 6, 1, tzinfo=UTC)


def run(second: int, outcome: str = "Created", job_id=None, trigger: str = "Cron") -> dict:
    fire = START + timedelta(seconds=second)
    return {"schedule_id": SCHEDULE, "slot": fire.replace(tzinfo=None), "fire_at": fire, "trigger": trigger,
            "outcome": outcome, "job_id": job_id}


def job(row: dict, replaces=None) -> dict:
    return {"id": row["job_id"] if replaces is None else uuid.uuid4(), "schedule_id": SCHEDULE,
            "schedule_slot": row["slot"], "replaces_job_id": replaces, "status": "Completed"}


def slots(runs: list[dict], jobs: list[dict]) -> Slots:
    return Slots([{"id": SCHEDULE, "cron": "*/5 * * * * *", "time_zone": "UTC", "state": "Active",
                   "incremental": False}], runs, jobs)


def test_every_slot_decided_once_with_its_one_export_is_no_violation():
    runs = [run(0, job_id=uuid.uuid4()), run(5, "Missed"), run(10, "Held"), run(12, job_id=uuid.uuid4(),
                                                                                  trigger="RunNow")]
    jobs = [job(runs[0]), job(runs[0], replaces=runs[0]["job_id"]), job(runs[3])]

    assert slot_violations(slots(runs, jobs)) == []


def test_a_cron_slot_never_decided_is_a_violation():
    runs = [run(0, "Missed"), run(10, "Missed")]

    [violation] = slot_violations(slots(runs, []))

    assert violation.rule == RULE and "1 cron slot(s) never decided" in violation.detail


def test_two_exports_of_one_slot_and_an_export_its_slot_does_not_name_are_violations():
    created = run(0, job_id=uuid.uuid4())
    twin = dict(job(created), id=uuid.uuid4())
    missed = run(5, "Missed")

    found = slot_violations(slots([created, missed], [job(created), twin, job(missed) | {"id": uuid.uuid4()}]))

    assert {v.rule for v in found} == {RULE}
    assert any("made 2 exports" in v.detail for v in found)
    assert any("not its slot's recorded export (Missed None)" in v.detail for v in found)
    assert any("Created without its one export" in v.detail for v in found)
