"""The whole system as real processes: ``exports relay``, two ``exports worker`` and ``exports
scheduler`` on a real PostgreSQL and a real Redis (EXPORTS_TEST_BROKER_URL, else an embedded one),
delivering to a real SFTP server, driven only through the ``exports`` command.

Where a scene needs the system held at a point (a build in progress, a delivery in progress), the
test holds a real resource (a table lock, the TCP link to the partner) and confirms from the system
itself (pg_stat_activity, the job's row) that it is waiting there, never by sleeping.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import pytest

from app.store.export import final_name
from exports_devtools.waiting import wait_until
from tests.acceptance.steps import (
    DEADLINE,
    OPERATOR,
    TENANT,
    assert_delivered_once,
    builder_blocked_by,
    cancel,
    create,
    hold_builds,
    job_row,
    set_up,
    status,
    transitions,
    wait_status,
)


def test_an_export_created_with_the_command_is_delivered_as_one_file_and_completes(system, admin, embedded_sftp):
    system.start_all()
    set_up(system, embedded_sftp)
    job_id = create(system)
    wait_status(system, admin, job_id, "Completed")
    assert_delivered_once(admin, embedded_sftp, job_id)
    assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "Finished"]


def test_an_export_canceled_while_queued_ends_canceled_and_no_file_is_ever_written(system, admin, embedded_sftp):
    # No worker yet: the export cannot leave Queued before the cancel.
    system.start_relay()
    system.start_scheduler()
    set_up(system, embedded_sftp)
    job_id = create(system)
    assert cancel(system, job_id)["outcome"] == "CanceledWhileQueued"
    system.start_worker()
    system.start_worker()
    wait_until(lambda: any("export.processed" in line and f"job_id={job_id}" in line
                           for line in system.worker_logs().splitlines()),
               "a worker to receive the canceled export's wake-up", DEADLINE, diagnostics=system.group.logs)
    assert (status(admin, job_id), job_row(admin, job_id)["attempt_count"]) == ("Canceled", 0)
    assert transitions(admin, job_id) == []
    assert embedded_sftp.files() == {}


def test_a_cancel_during_delivery_is_too_late_and_the_file_is_delivered(system, admin, embedded_sftp):
    faults = embedded_sftp.server.faults
    faults.hold_on = frozenset({"write"})   # the upload's first write to its temporary file
    try:
        system.start_all()
        set_up(system, embedded_sftp)
        job_id = create(system)
        # The upload is held at the partner: the worker is past cutoff 2 and nothing has been written.
        wait_status(system, admin, job_id, "Delivering")
        assert faults.held.wait(DEADLINE)
        answer = cancel(system, job_id)
        assert (answer["outcome"], answer["found_status"]) == ("TooLate", "Delivering")
        faults.resume.set()
        wait_status(system, admin, job_id, "Completed")
    finally:
        faults.resume.set()
    assert_delivered_once(admin, embedded_sftp, job_id)
    assert job_row(admin, job_id)["stop_request_id"] is None


def test_a_cancel_while_building_stops_the_export_and_no_file_is_ever_written(system, admin, db_url, embedded_sftp):
    system.start_all()
    set_up(system, embedded_sftp)
    holder = hold_builds(db_url)
    try:
        job_id = create(system)
        wait_status(system, admin, job_id, "Running")
        wait_until(lambda: builder_blocked_by(admin, holder), "the build to wait on the contacts lock", DEADLINE)
        answer = cancel(system, job_id)
        assert (answer["outcome"], answer["found_status"]) == ("StopRequested", "Running")
        # The watcher cancels the build's query itself: the lock is never released before Stopped.
        wait_status(system, admin, job_id, "Stopped")
    finally:
        holder.rollback()
        holder.close()
    assert transitions(admin, job_id) == ["Claimed", "Stopped"]
    assert embedded_sftp.files() == {}


def test_an_export_edited_while_queued_is_delivered_to_the_new_destination(system, admin, embedded_sftp):
    # No worker yet, so the export is still queued when the edit lands.
    system.start_relay()
    system.start_scheduler()
    set_up(system, embedded_sftp)
    archive = Path(embedded_sftp.config.remote_dir).parent / "archive"
    (embedded_sftp.inbox.parent / "archive").mkdir()
    key = embedded_sftp.config.host_key
    system.cli("destination", "add", "--no-check",
               "--tenant", TENANT, "--name", "archive", "--host", "127.0.0.1", "--port",
               str(embedded_sftp.config.port), "--username", embedded_sftp.config.username, "--remote-dir",
               str(archive), "--credential-ref", embedded_sftp.config.credential_ref, "--host-key", key)
    job_id = create(system)
    edited = system.cli("edit", job_id, "--tenant", TENANT, "--destination", "archive", "--expected-version", "1",
                        "--by", OPERATOR, "--json").json
    assert edited["version"] == 2
    system.start_worker()
    system.start_worker()
    wait_status(system, admin, job_id, "Completed")
    row = job_row(admin, job_id)
    assert row["version"] == 2
    assert embedded_sftp.files() == {}
    delivered = (embedded_sftp.inbox.parent / "archive" / final_name(row["delivery_key"])).read_bytes()
    assert hashlib.sha256(delivered).digest() == bytes(row["expected_file_sha256"])
    assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "Finished"]


def test_a_lost_wake_up_is_republished_by_the_sweeper_and_the_export_completes(system, admin, embedded_sftp):
    system.start_relay()
    system.start_scheduler()
    set_up(system, embedded_sftp)
    job_id = create(system)
    wait_until(lambda: admin.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s AND published_at IS NOT NULL",
                                     (job_id,)).fetchone()["n"] >= 1,
               "the relay to publish the wake-up", DEADLINE, diagnostics=system.group.logs)
    system.delete_queue()
    system.start_worker()
    system.start_worker()
    wait_status(system, admin, job_id, "Completed")
    assert job_row(admin, job_id)["sweep_count"] >= 1
    assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "Finished"]
    assert_delivered_once(admin, embedded_sftp, job_id)


def test_a_worker_killed_mid_build_is_recovered_and_the_export_is_delivered_exactly_once(
        system, admin, db_url, embedded_sftp):
    system.start_all()
    set_up(system, embedded_sftp)
    holder = hold_builds(db_url)
    try:
        job_id = create(system)
        wait_status(system, admin, job_id, "Running")
        wait_until(lambda: builder_blocked_by(admin, holder), "the build to wait on the contacts lock", DEADLINE)
        pid = int(job_row(admin, job_id)["claimed_by"].split(":")[1])
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent in {r.process.pid for r in system.group.running if r.name.startswith("worker")}
        os.kill(pid, signal.SIGKILL)
    finally:
        holder.rollback()
        holder.close()
    wait_status(system, admin, job_id, "Completed")
    assert transitions(admin, job_id) == ["Claimed", "RequeuedByRecovery", "Claimed", "DeliveryAuthorized", "Finished"]
    assert job_row(admin, job_id)["attempt_count"] == 2
    assert_delivered_once(admin, embedded_sftp, job_id)


def test_a_worker_killed_during_delivery_ends_outcome_unknown_and_a_replacement_delivers_once(
        system, admin, embedded_sftp):
    faults = embedded_sftp.server.faults
    # The upload's first request (its temporary file) hangs at the partner until the server stops.
    faults.hang_on = frozenset({"open"})
    try:
        system.start_all()
        set_up(system, embedded_sftp)
        job_id = create(system)
        # Past cutoff 2, its upload hanging at the partner: nothing has been written.
        wait_status(system, admin, job_id, "Delivering")
        assert faults.hanging.wait(DEADLINE)
        pid = int(job_row(admin, job_id)["claimed_by"].split(":")[1])
        os.kill(pid, signal.SIGKILL)
        # Recovery cannot tell whether the dead attempt uploaded: an absent file is no proof of failure.
        wait_status(system, admin, job_id, "OutcomeUnknown")
        assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "ResolvedByRecovery"]
        assert embedded_sftp.files() == {}

        replacement = system.cli("replace", job_id, "--tenant", TENANT, "--by", OPERATOR, "--reason",
                                 "the partner confirmed nothing arrived", "--json").json["job_id"]
        wait_status(system, admin, replacement, "Completed")
    finally:
        faults.hang_on = frozenset()
    row = job_row(admin, replacement)
    assert (str(row["replaces_job_id"]), row["delivery_key"]) == (job_id, job_row(admin, job_id)["delivery_key"])
    assert status(admin, job_id) == "OutcomeUnknown"
    assert_delivered_once(admin, embedded_sftp, replacement)


@pytest.mark.rabbitmq
def test_on_rabbitmq_an_export_created_with_the_command_completes(rabbitmq_system, admin, embedded_sftp):
    rabbitmq_system.start_all()
    set_up(rabbitmq_system, embedded_sftp)
    job_id = create(rabbitmq_system)
    wait_status(rabbitmq_system, admin, job_id, "Completed")
    assert_delivered_once(admin, embedded_sftp, job_id)
