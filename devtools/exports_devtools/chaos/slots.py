"""The chaos checker's schedule rule, ``slot-not-once``: each slot a schedule decided is recorded once and
made at most one export, the one its row names; every export a schedule made is its slot's; and no cron slot
between a schedule's first and last recorded one is missing (a slot is never lost, whatever scheduler was
killed, restarted or cut off from the database, and however many ran). A slot may rightly be ``Missed``
(older than the grace) or ``Held`` (an incremental run unsettled); it may never be skipped or doubled."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from app.maintenance.cron import Cron
from exports_devtools.chaos.record import Violation
from exports_devtools.store.chaos import Slots

RULE = "slot-not-once"
Row = dict[str, Any]


def slot_violations(slots: Slots) -> list[Violation]:
    found: list[Violation] = []

    def flag(job_id: Any, detail: str) -> None:
        found.append(Violation(RULE, job_id, detail))

    runs = {(r["schedule_id"], r["slot"]): r for r in slots.runs}
    originals: dict[tuple[Any, Any], list[Row]] = defaultdict(list)
    for job in slots.jobs:
        if job["replaces_job_id"] is None:
            originals[(job["schedule_id"], job["schedule_slot"])].append(job)
    for key, jobs in originals.items():
        run = runs.get(key)
        if len(jobs) > 1:
            flag(jobs[1]["id"], f"slot {key[1]} of schedule {key[0]} made {len(jobs)} exports")
        if run is None or run["outcome"] != "Created" or run["job_id"] != jobs[0]["id"]:
            flag(jobs[0]["id"], f"export of slot {key[1]} of schedule {key[0]} is not its slot's recorded export "
                                f"({run['outcome'] + ' ' + str(run['job_id']) if run else 'no slot row'})")
    for key, run in runs.items():
        if run["outcome"] == "Created" and [j["id"] for j in originals.get(key, [])] != [run["job_id"]]:
            flag(run["job_id"], f"slot {key[1]} of schedule {key[0]} was Created without its one export")
    for schedule in slots.schedules:
        cron_slots = sorted(r["slot"] for r in slots.runs
                            if r["schedule_id"] == schedule["id"] and r["trigger"] == "Cron")
        if not cron_slots:
            continue
        first = next(r for r in slots.runs if r["schedule_id"] == schedule["id"] and r["slot"] == cron_slots[0])
        cron = Cron.parse(schedule["cron"], schedule["time_zone"])
        expected: list[Any] = []
        fire = first["fire_at"]
        while fire is not None and cron.slot(fire) <= cron_slots[-1]:
            if cron.slot(fire) not in expected:
                expected.append(cron.slot(fire))
            fire = cron.after(fire)
        missing = sorted(set(expected) - set(cron_slots))
        extra = sorted(set(cron_slots) - set(expected))
        if missing or extra:
            flag(None, f"schedule {schedule['id']}: {len(missing)} cron slot(s) never decided (first "
                       f"{missing[:3]}), {len(extra)} not of its cron (first {extra[:3]})")
    return found
