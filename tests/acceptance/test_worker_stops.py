"""``exports worker`` stopped mid-upload the ways supervisors stop it: SIGTERM to the pid it prints (systemd's
KillMode=mixed, an operator's ``kill``), to its worker processes (a supervisor that signals every process
of the service), or to the whole process group (honcho, a terminal), once or several times. Each time
the worker lets the upload finish, the export is Completed by its own attempt, and the worker exits 0:
a repeated signal never kills a worker process mid-upload. And a drain has a deadline: an upload that
outlasts EXPORTS_WORKER_STOP_SECONDS is abandoned to recovery, and the worker still exits.

The upload is held at the partner (its first write waits on the embedded server's fault hook), so every
signal is sent, and seen handled in the worker process's own log, while the worker is past cutoff 2.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from exports_devtools.processes import Running
from exports_devtools.waiting import wait_until
from tests.acceptance.steps import (
    DEADLINE,
    assert_delivered_once,
    create,
    job_row,
    set_up,
    status,
    transitions,
    wait_status,
)

#: The worker's drain timeout in the scenes where the upload must finish: longer than any scene's wait.
LONG_STOP_SECONDS = "120"
#: In the scene that outlasts it.
SHORT_STOP_SECONDS = 2
#: The events a worker process logs for each stop signal it handles (app/actors/draining.py).
HANDLED = ("worker.draining", "worker.stop_signal_ignored")


def _records(process: Running) -> list[dict[str, Any]]:
    return [json.loads(line) for line in process.log().splitlines() if line.startswith("{")]


def _handled_by(process: Running, pid: int) -> int:
    """How many stop signals the worker process ``pid`` has handled, by its own log."""
    return sum(1 for r in _records(process) if r.get("pid") == pid and r["event"] in HANDLED)


def _forwarded(process: Running) -> int:
    """How many stop signals the worker's main process passed on to its worker processes (Dramatiq's line)."""
    return sum(1 for r in _records(process) if r.get("pid") == process.pid and "to subprocesses" in r["event"])


def _children(pid: int) -> list[int]:
    children = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue   # gone meanwhile
    return children


def _start_worker(system, stop_seconds: str) -> Running:
    system.group.env.update(EXPORTS_LOG_FORMAT="json", EXPORTS_WORKER_STOP_SECONDS=stop_seconds)
    system.start_relay()
    worker = system.group.start("worker", "worker", "--processes", "2", "--threads", "1")
    wait_until(lambda: sum(1 for r in _records(worker) if r["event"] == "Worker process is ready for action.") == 2,
               "both worker processes to be ready", DEADLINE, diagnostics=system.group.logs)
    return worker


def _holding_an_upload(system, admin, embedded_sftp, worker: Running) -> tuple[str, int]:
    """An export created and held at its upload's first write; its id and the worker process holding it."""
    faults = embedded_sftp.server.faults
    faults.hold_on = frozenset({"write"})
    set_up(system, embedded_sftp)
    job_id = create(system)
    wait_status(system, admin, job_id, "Delivering")
    assert faults.held.wait(DEADLINE), system.group.logs()
    holder = int(job_row(admin, job_id)["claimed_by"].split(":")[1])
    assert holder in _children(worker.pid)
    return job_id, holder


def _send(target: str, worker: Running) -> None:
    if target == "parent":
        os.kill(worker.pid, signal.SIGTERM)
    elif target == "children":
        for child in _children(worker.pid):
            os.kill(child, signal.SIGTERM)
    else:
        os.killpg(worker.pid, signal.SIGTERM)   # the harness starts each command in a session of its own


@pytest.mark.parametrize("times", [1, 3], ids=["once", "three-times"])
@pytest.mark.parametrize("target", ["parent", "children", "group"])
def test_a_worker_signalled_mid_upload_lets_the_upload_finish_and_the_export_completes(
        system, admin, embedded_sftp, target, times):
    worker = _start_worker(system, LONG_STOP_SECONDS)
    faults = embedded_sftp.server.faults
    try:
        job_id, holder = _holding_an_upload(system, admin, embedded_sftp, worker)
        for sent in range(1, times + 1):
            _send(target, worker)
            # Each signal handled before the next is sent, so none merges with another still pending.
            wait_until(lambda sent=sent: _handled_by(worker, holder) >= sent,
                       f"the worker process to handle signal {sent}", DEADLINE, diagnostics=worker.log)
            if target == "parent":
                assert _forwarded(worker) == sent
        # Every signal arrived while the upload was held: the worker process is still there, draining.
        assert worker.code is None and status(admin, job_id) == "Delivering", worker.log()
    finally:
        faults.resume.set()
    worker.process.wait(DEADLINE)

    log = worker.log()
    assert worker.code == 0, log[-4000:]
    assert "Killing worker process" not in log
    assert status(admin, job_id) == "Completed"
    assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "Finished"]
    assert job_row(admin, job_id)["attempt_count"] == 1
    assert_delivered_once(admin, embedded_sftp, job_id)
    # The signals beyond the first were seen and ignored by the worker process holding the upload.
    assert _handled_by(worker, holder) >= times


def test_a_worker_whose_upload_outlasts_its_stop_timeout_abandons_it_to_recovery_and_still_exits(
        system, admin, embedded_sftp):
    worker = _start_worker(system, str(SHORT_STOP_SECONDS))
    faults = embedded_sftp.server.faults
    try:
        job_id, holder = _holding_an_upload(system, admin, embedded_sftp, worker)
        _send("parent", worker)
        # Never released while the worker stops: it exits by itself, its deadline well within the wait.
        worker.process.wait(DEADLINE)
        abandoned = [r for r in _records(worker) if r["event"] == "worker.stopped_with_attempts_in_flight"]
        assert [(r["pid"], r["attempts"]) for r in abandoned] == [(holder, 1)], worker.log()[-4000:]
        # Nothing written past cutoff 2: recovery resolves the attempt from evidence once its lease expires.
        assert status(admin, job_id) == "Delivering"
        assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized"]
    finally:
        faults.resume.set()
