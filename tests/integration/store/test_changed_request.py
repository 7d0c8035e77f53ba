"""A changed request (`export_edit_terms`): the version increments, so a worker that checked the old terms
fails its claim and builds nothing, and the edit's own wake-up brings the job back for a fresh evaluation."""

from __future__ import annotations

import uuid

from app.store import connector, export
from app.store.types import ClaimResult, EditResult, Role, Status
from tests.support import wait_until_blocked


def edit(conn, job, destination_id, expected_version=1, tenant_id=None):
    return export.edit_terms(conn, tenant_id=tenant_id or job.tenant_id, job_id=job.id,
                           expected_version=expected_version, destination_id=destination_id)


def db_clock(admin):
    return admin.execute("SELECT clock_timestamp() AS t").fetchone()["t"]


def claim(app_db, job, checked_version):
    return export.claim(app_db, job_id=job.id, checked_version=checked_version, attempt_id=uuid.uuid4(),
                      worker_id="w1", lease_seconds=60)


def test_an_edit_increments_the_version_and_sets_woken_at_from_the_database_clock(conn, admin, seed):
    job = seed.queued()
    new_destination = seed.destination(job.tenant_id)
    seed.age_wakeup(job, 10)

    before = db_clock(admin)
    outcome = edit(conn, job, new_destination)
    after = db_clock(admin)

    assert outcome.result is EditResult.CHANGED and outcome.version == 2
    row = seed.row(job)
    assert row["version"] == 2 and row["destination_id"] == new_destination
    assert before <= row["woken_at"] <= after


def test_an_edit_writes_a_new_wakeup_with_a_new_message_id(conn, seed):
    job = seed.queued()
    [created] = seed.outbox(job)

    edit(conn, job, seed.destination(job.tenant_id))

    outbox = seed.outbox(job)
    assert len(outbox) == 2
    assert outbox[0] == created
    assert outbox[1]["message_id"] != created["message_id"] and outbox[1]["published_at"] is None


def test_a_claim_with_the_version_checked_before_an_edit_is_lost_and_builds_nothing(conn, app_db, seed):
    job = seed.queued()
    edit(conn, job, seed.destination(job.tenant_id))

    assert claim(app_db, job, checked_version=1) is ClaimResult.LOST

    row = seed.row(job)
    assert row["status"] == "Queued" and row["attempt_id"] is None and row["attempt_count"] == 0
    assert seed.events(job) == []


def test_a_claim_with_the_edited_version_succeeds(conn, app_db, seed):
    job = seed.queued()
    edit(conn, job, seed.destination(job.tenant_id))

    assert claim(app_db, job, checked_version=2) is ClaimResult.CLAIMED

    assert seed.status(job) is Status.RUNNING
    [event] = seed.events(job)
    assert event["kind"] == "Claimed" and event["version"] == 2


def test_an_edit_of_a_job_that_is_no_longer_queued_changes_nothing(conn, seed):
    job = seed.running()
    new_destination = seed.destination(job.tenant_id)
    before, outbox_before = seed.row(job), seed.outbox(job)

    assert edit(conn, job, new_destination).result is EditResult.NOT_CHANGED

    assert seed.row(job) == before
    assert seed.outbox(job) == outbox_before


def test_an_edit_with_a_stale_expected_version_changes_nothing(conn, seed):
    job = seed.queued()
    assert edit(conn, job, seed.destination(job.tenant_id), expected_version=1).result is EditResult.CHANGED
    before, outbox_before = seed.row(job), seed.outbox(job)

    # A second operator who read version 1 before the first edit.
    assert edit(conn, job, seed.destination(job.tenant_id), expected_version=1).result is EditResult.NOT_CHANGED

    assert seed.row(job) == before
    assert seed.outbox(job) == outbox_before


def test_an_edit_to_the_destination_the_job_already_has_changes_nothing_and_keeps_the_version(conn, seed):
    job = seed.queued()
    before, outbox_before = seed.row(job), seed.outbox(job)

    assert edit(conn, job, job.destination_id).result is EditResult.NOT_CHANGED

    assert seed.row(job) == before and before["version"] == 1
    assert seed.outbox(job) == outbox_before


def test_an_edit_for_another_tenant_changes_nothing(conn, seed):
    job = seed.queued()
    other_tenant = seed.tenant("Other")
    other_destination = seed.destination(other_tenant)
    before, outbox_before = seed.row(job), seed.outbox(job)

    assert edit(conn, job, other_destination, tenant_id=other_tenant).result is EditResult.NOT_CHANGED

    assert seed.row(job) == before
    assert seed.outbox(job) == outbox_before


def test_an_edit_to_another_tenants_destination_changes_nothing(conn, seed):
    job = seed.queued()
    foreign_destination = seed.destination(seed.tenant("Other"))
    before, outbox_before = seed.row(job), seed.outbox(job)

    assert edit(conn, job, foreign_destination).result is EditResult.NOT_CHANGED

    assert seed.row(job) == before
    assert seed.outbox(job) == outbox_before


def test_a_rejection_of_the_version_checked_before_an_edit_matches_nothing(conn, seed):
    job = seed.queued()
    edit(conn, job, seed.destination(job.tenant_id))
    before = seed.row(job)

    assert export.reject(conn, job_id=job.id, checked_version=1) is False
    assert seed.row(job) == before

    # The edited terms are what the next evaluation rejects, if it does.
    assert export.reject(conn, job_id=job.id, checked_version=2) is True
    assert seed.status(job) is Status.REJECTED


# --- an edit and a claim racing for the row -------------------------------------------------------


def test_a_claim_waiting_on_an_uncommitted_edit_is_refused_once_the_edit_commits(connect_as, admin, seed, threads):
    job = seed.queued()
    editor = connect_as(Role.APP, autocommit=False)
    assert editor.execute(connector.text("export_edit_terms"), dict(
        tenant_id=job.tenant_id, job_id=job.id, expected_version=1,
        destination_id=seed.destination(job.tenant_id))).fetchone()["version"] == 2
    worker = connect_as(Role.APP)

    claim = threads.submit(export.try_claim, worker, job_id=job.id, checked_version=1, attempt_id=uuid.uuid4(),
                           worker_id="w1", lease_seconds=60)
    wait_until_blocked(admin, worker.info.backend_pid, by=editor.info.backend_pid)
    editor.commit()

    assert claim.result(timeout=10) == 0
    row = seed.row(job)
    assert row["status"] == "Queued" and row["version"] == 2 and row["attempt_count"] == 0
    assert seed.events(job) == []


def test_an_edit_waiting_on_an_uncommitted_claim_changes_nothing_once_the_claim_commits(
        connect_as, admin, seed, threads):
    job = seed.queued()
    worker = connect_as(Role.APP, autocommit=False)
    assert export.try_claim(worker, job_id=job.id, checked_version=1, attempt_id=uuid.uuid4(), worker_id="w1",
                          lease_seconds=60) == 1
    operator = connect_as(Role.APP)
    outbox_before = seed.outbox(job)

    edit_result = threads.submit(edit, operator, job, seed.destination(job.tenant_id))
    wait_until_blocked(admin, operator.info.backend_pid, by=worker.info.backend_pid)
    worker.commit()

    assert edit_result.result(timeout=10).result is EditResult.NOT_CHANGED
    row = seed.row(job)
    assert row["status"] == "Running" and row["version"] == 1 and row["destination_id"] == job.destination_id
    assert seed.outbox(job) == outbox_before
