"""One export followed through the logs by its job_id, as an operator would with ``jq``: ``exports relay``,
two ``exports worker`` and ``exports scheduler`` as real processes with EXPORTS_LOG_FORMAT=json, every
line each of them writes one JSON object, and the export's lines (the relay's publications, the claims,
the delivery's own lines, the terminal write and recovery's takeover) carrying ``job_id`` and
``attempt_id`` as fields.

Recovery acts on the export because the test makes it: the first attempt's worker is killed while its
build waits on a table lock the test holds (confirmed with ``pg_blocking_pids``), its lease expires
(3 s), and the scheduler requeues it for the second worker.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import psycopg

from exports_devtools.processes import Running
from exports_devtools.waiting import wait_until
from tests.acceptance.steps import DEADLINE, builder_blocked_by, create, set_up, wait_status
from tests.fixtures.processes import stop_all


def _json_lines(process: Running) -> list[dict[str, Any]]:
    """Every line the process wrote, each parsed as one JSON object: a line that is not one fails the test."""
    lines = []
    for number, line in enumerate(process.log().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"{process.name}.log line {number} is not JSON: {line!r}") from None
        assert isinstance(record, dict) and "event" in record, f"{process.name}.log line {number}: {line!r}"
        lines.append(record)
    return lines


def test_one_export_is_followed_by_its_job_id_through_the_json_logs_of_the_relay_the_workers_and_the_scheduler(
        system, admin, db_url, embedded_sftp):
    # DEBUG for the relay's line per published message (at INFO it writes only a count per batch).
    system.group.env.update(EXPORTS_LOG_FORMAT="json", EXPORTS_DEBUG="1")
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
    # Parsed whole, then selected by the field, as `jq 'select(.job_id == ...)'` would.
    lines = {p.name: [r for r in _json_lines(p) if r.get("job_id") == job_id] for p in processes}
    worker_lines = [r for name, records in lines.items() if name.startswith("worker") for r in records]

    def events(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
        return [r for r in records if r["event"] == event]

    # The relay: a line for each wake-up it published, naming its outbox row.
    assert {r["message_id"] for r in events(lines["relay"], "relay.enqueued")} == published_ids
    # The workers: each claim with the attempt it started, the first in the process that was killed.
    claimed = {r["attempt_id"]: r["pid"] for r in events(worker_lines, "runner.claimed")}
    assert claimed.keys() == {first, second} and claimed[first] == pid != claimed[second]
    # The scheduler: recovery's takeover of the first attempt once its lease expired.
    assert [(r["attempt_id"], r["written"]) for r in events(lines["scheduler"], "recovery.requeue")] == [(first, True)]
    # The delivery's own lines (app/delivery) name the job through the runner's binding, and the
    # second attempt as a field.
    delivery = [r for r in worker_lines if r["logger"].startswith("app.delivery.")]
    assert {"delivery.baseline", "delivery.finished"} <= {r["event"] for r in delivery}
    assert {(r["attempt_id"], r["pid"]) for r in delivery} == {(second, claimed[second])}
    assert events(delivery, "delivery.finished")[0]["outcome"] == "Completed"
    # The terminal write.
    [delivered] = events(worker_lines, "runner.delivered")
    assert (delivered["attempt_id"], delivered["outcome"], delivered["write"]) == (second, "Completed", "Written")
    # Every line the runner wrote about the job names its attempt, though no call passes it.
    assert {r.get("attempt_id") for r in worker_lines if r["logger"] == "app.actors.runner"} == {first, second}
