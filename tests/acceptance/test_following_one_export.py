"""One export followed through the logs by its job_id, as an operator would with ``jq``: ``exports relay``,
two ``exports worker`` and ``exports scheduler`` as real processes with EXPORTS_LOG_FORMAT=json, every
line each of them writes one JSON object (``jq`` reads each log whole, and stops at a line that is not
one), and the export's lines (the relay's line per published wake-up, at INFO, the claims, the
delivery's own lines, the terminal write and recovery's takeover) carrying ``tenant_id``, ``job_id``,
and where they are known ``attempt_id`` and ``message_id``, as fields.

Recovery acts on the export because the test makes it: the first attempt's worker is killed while its
build waits on a table lock the test holds (confirmed with ``pg_blocking_pids``), its lease expires
(3 s), and the scheduler requeues it for the second worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from typing import Any

import psycopg

from exports_devtools.processes import Running
from exports_devtools.waiting import wait_until
from tests.acceptance.steps import DEADLINE, builder_blocked_by, create, set_up, wait_status
from tests.fixtures.processes import stop_all
from tests.support import unavailable


def _jq(process: Running, select: str, **args: str) -> list[dict[str, Any]]:
    """``jq -c --arg name value ... 'select(...)' <process>.log``, the documented pipeline: the lines it
    selects, parsed. jq reads the whole log, so a line that is not one JSON object fails it, and the test."""
    jq = shutil.which("jq")
    if jq is None:
        unavailable("jq is not installed (.ci/install-deploy-tools installs it)")
    argv = [jq, "-c"] + [a for name, value in args.items() for a in ("--arg", name, value)] + [select]
    done = subprocess.run(argv, stdin=process.log_path.open("rb"), capture_output=True, timeout=60)
    assert done.returncode == 0, f"jq over {process.name}.log: {done.stderr.decode(errors='replace')}"
    records = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert all(isinstance(r, dict) and "event" in r for r in records), records
    return records


def events(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


def test_one_export_is_followed_with_jq_by_its_ids_through_the_json_logs_of_the_relay_the_workers_and_the_scheduler(
        system, admin, db_url, embedded_sftp):
    system.group.env.update(EXPORTS_LOG_FORMAT="json")
    system.start_all()
    set_up(system, embedded_sftp)
    holder = psycopg.connect(db_url, autocommit=False)
    holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")   # the first build waits behind it
    try:
        job_id = create(system)
        wait_status(system, admin, job_id, "Running")
        wait_until(lambda: builder_blocked_by(admin, holder), "the build to wait on the contacts lock", DEADLINE)
        pid = int(admin.execute("SELECT claimed_by FROM export_jobs WHERE id = %s",
                                (job_id,)).fetchone()["claimed_by"].split(":")[1])
        os.kill(pid, signal.SIGKILL)
    finally:
        holder.rollback()
        holder.close()
    wait_status(system, admin, job_id, "Completed")
    processes = list(system.group.running)
    stop_all(system.group)   # every line written and flushed before any is read

    claims = [str(r["attempt_id"]) for r in admin.execute(
        "SELECT attempt_id FROM export_attempt_events WHERE job_id = %s AND kind = 'Claimed' ORDER BY id", (job_id,))]
    assert len(claims) == 2
    first, second = claims
    # The wake-up and recovery's new one; the sweeper may have added another if a claim was slow.
    published_ids = {str(r["message_id"]) for r in admin.execute(
        "SELECT message_id FROM outbox WHERE job_id = %s AND published_at IS NOT NULL", (job_id,))}
    assert len(published_ids) >= 2
    tenant_id = str(admin.execute("SELECT tenant_id FROM export_jobs WHERE id = %s", (job_id,)).fetchone()["tenant_id"])
    # What an operator types: `jq -c --arg job ... 'select(.job_id == $job)'` over each process's log.
    lines = {p.name: _jq(p, "select(.job_id == $job)", job=job_id) for p in processes}
    worker_lines = [r for name, records in lines.items() if name.startswith("worker") for r in records]
    assert lines["relay"] and lines["scheduler"] and worker_lines
    # Every line about the export, in every process, names its tenant.
    assert {(name, r["event"], r.get("tenant_id")) for name, records in lines.items() for r in records
            if r.get("tenant_id") != tenant_id} == set()
    # Every worker line about it names the wake-up it was handling, one the relay published.
    assert {r.get("message_id") for r in worker_lines} <= published_ids
    # Followed the other way, by a wake-up's message id: the relay's publication, then the worker's lines.
    [woken] = {r["message_id"] for r in events(worker_lines, "runner.claimed") if r["attempt_id"] == second}
    by_message = [r for p in processes for r in _jq(p, "select(.message_id == $m)", m=woken)]
    assert {r["event"] for r in by_message} >= {"relay.enqueued", "runner.claimed", "runner.delivered"}

    # The relay: a line for each wake-up it published, naming its outbox row.
    assert {r["message_id"] for r in events(lines["relay"], "relay.enqueued")} == published_ids
    # The workers: each claim with the attempt it started, the first in the process that was killed.
    claimed = {r["attempt_id"]: r["pid"] for r in events(worker_lines, "runner.claimed")}
    assert claimed.keys() == {first, second} and claimed[first] == pid != claimed[second]
    # The scheduler: recovery's takeover of the first attempt once its lease expired.
    assert [(r["attempt_id"], r["written"]) for r in events(lines["scheduler"], "recovery.requeue")] == [(first, True)]
    # One line per transition: an ordinary delivery (no file there before, Completed) says nothing at
    # INFO of its own; the runner's lines say it (the delivery's lines carry the runner's binding at
    # any level: tests/unit/test_logs.py).
    assert [r["event"] for r in worker_lines if r["logger"].startswith("app.delivery.")] == []
    assert [r["event"] for r in worker_lines if r.get("attempt_id") == second and r["level"] == "INFO"] == [
        "runner.claimed", "runner.authorized", "runner.delivered", "export.processed"]
    # The terminal write.
    [delivered] = events(worker_lines, "runner.delivered")
    assert (delivered["attempt_id"], delivered["outcome"], delivered["write"]) == (second, "Completed", "Written")
    # Every line the runner wrote about the job names its attempt, though no call passes it.
    assert {r.get("attempt_id") for r in worker_lines if r["logger"] == "app.actors.runner"} == {first, second}
