"""The runner and the destination's delivery mode: cutoff 2 records the mode the file is published in, and
a mode the profile cannot serve (no-rename, which publishes by the completion marker, for a profile
without one) fails the export as a configuration error before anything is built or sent."""

from __future__ import annotations

from app.actors.runner import RunOutcome
from app.store.types import Status


def _mode(worker, mode: str) -> None:
    worker.conn.execute("UPDATE destinations SET delivery_mode = %s WHERE id = %s", (mode, worker.destination_id))


def test_cutoff_2_records_the_mode_the_file_is_published_in(worker):
    _mode(worker, "no-stat")
    job = worker.queued()

    result = worker.runner().run(job.id)

    row = worker.seed.row(job)
    assert (result.delivery, row["status"], row["expected_delivery_mode"]) == (Status.COMPLETED, "Completed", "no-stat")


def test_no_rename_for_a_profile_without_a_completion_marker_fails_before_anything_is_built(worker):
    _mode(worker, "no-rename")
    job = worker.queued()

    result = worker.runner().run(job.id)

    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"], row["delivery_authorized_at"]) == ("Failed", "BuildFailed", None)
    failed = [e["detail"] for e in worker.seed.events(job) if e["kind"] == "Failed"]
    assert result.outcome is not RunOutcome.DELIVERED
    assert len(failed) == 1 and "(configuration)" in failed[0] and "completion marker" in failed[0]
    assert worker.peer.files() == {} and worker.local_files() == []
