"""A real ``exports scheduler`` killed (SIGKILL) while it creates a slot's export, and another killed right
after its commit: the schedulers that come after never duplicate a slot and never lose one. The kill point is
forced through the database proxy (a statement held until the process is dead), not hoped for."""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from app.maintenance.cron import Cron
from app.store import schedule
from exports_devtools.processes import clean_environ
from exports_devtools.waiting import wait_until

#: A fire every two seconds, in a zone of its own, so a test sees several slots in a few seconds.
CRON = "*/2 * * * * *"
SETTINGS = {"EXPORTS_SCHEDULE_INTERVAL": "0.2", "EXPORTS_RECOVERY_INTERVAL": "5", "EXPORTS_SCHEDULER_METRICS": "off",
            "EXPORTS_HEARTBEAT_SECONDS": "1"}


def _add(seed) -> uuid.UUID:
    tenant_id = seed.tenant()
    schedule_id = uuid.uuid4()
    cron = Cron.parse(CRON, "Europe/Berlin")
    assert schedule.add(seed.conn, schedule_id=schedule_id, tenant_id=tenant_id,
                        destination_id=seed.destination(tenant_id), cron=CRON, time_zone="Europe/Berlin",
                        incremental=False, next_fire_at=cron.first_at_or_after(datetime.now(UTC)),
                        changed_by="op-1") is schedule.AddResult.ADDED
    return schedule_id


def _runs(admin, schedule_id) -> list[dict]:
    return admin.execute("SELECT * FROM schedule_runs WHERE schedule_id = %s ORDER BY slot", (schedule_id,)).fetchall()


def _exports(admin, schedule_id) -> list[dict]:
    return admin.execute("SELECT * FROM export_jobs WHERE schedule_id = %s", (schedule_id,)).fetchall()


def _each_slot_once(admin, schedule_id) -> None:
    runs, exports = _runs(admin, schedule_id), _exports(admin, schedule_id)
    created = {r["slot"]: r["job_id"] for r in runs if r["outcome"] == "Created"}
    assert Counter(e["schedule_slot"] for e in exports) == Counter(created.keys())   # one export per Created slot
    assert {e["schedule_slot"]: e["id"] for e in exports} == created
    cron = Cron.parse(CRON, "Europe/Berlin")
    expected = [cron.slot(f) for f in cron.upcoming(runs[0]["fire_at"], len(runs))]
    assert [r["slot"] for r in runs] == expected   # no slot lost between the first and the last


def _scheduler_backends_gone(admin) -> bool:
    return admin.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'exports-scheduler'"
                         ).fetchone()["n"] == 0


def test_a_scheduler_killed_while_creating_a_slots_export_leaves_the_slot_to_the_next_which_decides_it_once(
        seed, admin, pg_proxy, process_group, tmp_path: Path):
    schedule_id = _add(seed)
    group = process_group(clean_environ(EXPORTS_DATABASE_URL=pg_proxy.url, EXPORTS_STATE_DIR=str(tmp_path),
                                        **SETTINGS))
    # The export is written, its transaction (slot row, next fire time) still open: kill the process there.
    hold = pg_proxy.hold_statement("export_create", after_reply=True)
    dying = group.start("scheduler-1", "scheduler")
    assert hold.reached.wait(30), dying.log()[-3000:]
    os.kill(dying.pid, signal.SIGKILL)
    dying.process.wait(10)
    hold.release()
    wait_until(lambda: _scheduler_backends_gone(admin), "the killed scheduler's sessions to end", 30)
    assert _exports(admin, schedule_id) == [] and _runs(admin, schedule_id) == []   # all of it rolled back
    group.running.remove(dying)

    group.start("scheduler-2", "scheduler")
    wait_until(lambda: len(_exports(admin, schedule_id)) >= 3, "the next scheduler to create three slots' exports",
               60)

    _each_slot_once(admin, schedule_id)


def test_a_scheduler_killed_right_after_committing_a_slot_never_has_it_created_again(
        seed, admin, pg_proxy, process_group, tmp_path: Path):
    schedule_id = _add(seed)
    group = process_group(clean_environ(EXPORTS_DATABASE_URL=pg_proxy.url, EXPORTS_STATE_DIR=str(tmp_path),
                                        **SETTINGS))
    dying = group.start("scheduler-1", "scheduler")
    wait_until(lambda: _exports(admin, schedule_id), "the first slot's export", 60)
    # Its next pass is held at its first statement: everything it committed is behind it.
    hold = pg_proxy.hold_statement("schedule_read_due")
    assert hold.reached.wait(30), dying.log()[-3000:]
    decided = _runs(admin, schedule_id)
    os.kill(dying.pid, signal.SIGKILL)
    dying.process.wait(10)
    hold.release()
    wait_until(lambda: _scheduler_backends_gone(admin), "the killed scheduler's sessions to end", 30)
    group.running.remove(dying)

    group.start("scheduler-2", "scheduler")
    wait_until(lambda: len(_runs(admin, schedule_id)) >= len(decided) + 3, "three more slots decided", 60)

    assert _runs(admin, schedule_id)[:len(decided)] == decided   # what it decided stands, unchanged
    _each_slot_once(admin, schedule_id)
