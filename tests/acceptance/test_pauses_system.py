"""A pause through the running system: relay, two workers and the scheduler as real processes. An export
created for a paused destination reaches a worker, which leaves it Queued, unclaimed; the resume wakes it
and it is delivered once."""

from __future__ import annotations

from exports_devtools.waiting import wait_until
from tests.acceptance.steps import (
    DEADLINE,
    OPERATOR,
    TENANT,
    assert_delivered_once,
    create,
    job_row,
    set_up,
    status,
    transitions,
    wait_status,
)


def test_a_paused_destinations_export_is_held_by_the_running_workers_and_delivered_after_resume(
        system, admin, embedded_sftp):
    system.start_all()
    set_up(system, embedded_sftp)
    system.cli("destination", "pause", "partner", "--tenant", TENANT, "--by", OPERATOR, "--reason", "maintenance")

    job_id = create(system)

    # The creation's wake-up went through the relay to a worker, which held the export: not a guess that
    # enough time passed, the worker's own line about this export.
    wait_until(lambda: any("export.processed" in line and f"job_id={job_id}" in line and "outcome=Held" in line
                           for line in system.worker_logs().splitlines()),
               "a worker to hold the paused destination's export", DEADLINE, diagnostics=system.group.logs)
    assert (status(admin, job_id), job_row(admin, job_id)["attempt_count"]) == ("Queued", 0)
    assert transitions(admin, job_id) == []

    system.cli("destination", "resume", "partner", "--tenant", TENANT, "--by", OPERATOR)

    wait_status(system, admin, job_id, "Completed")
    assert_delivered_once(admin, embedded_sftp, job_id)
    assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "Finished"]
