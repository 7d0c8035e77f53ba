"""The request record (`cancellation.request_cancellation`): one short transaction under the job's row
lock decides the outcome, records what it found, and answers a repeated click from the record.

Interleavings are forced with a held row lock on another connection and confirmed with pg_blocking_pids.
"""

from __future__ import annotations

import dataclasses
import uuid
from concurrent.futures import Future

import pytest

from app.store import connector, export
from app.store.cancellation import request_cancellation
from app.store.types import CancellationOutcome, CancellationReply, FailureCode, Role, Status
from tests.support import wait_until_blocked

#: Long enough that a waiting statement in these tests never times out unless a test means it to.
PATIENT = "30s"


def cancel(conn, job, request_id=None, requested_by="op-1", tenant_id=None, **kwargs):
    return request_cancellation(conn, tenant_id=tenant_id or job.tenant_id, job_id=job.id,
                                request_id=request_id or uuid.uuid4(), requested_by=requested_by, **kwargs)


def records(admin, tenant_id=None) -> list[dict]:
    if tenant_id is None:
        return admin.execute("SELECT * FROM cancellation_requests ORDER BY recorded_at").fetchall()
    return admin.execute("SELECT * FROM cancellation_requests WHERE tenant_id = %s ORDER BY recorded_at",
                         (tenant_id,)).fetchall()


def hold_row_lock(connect_as, job):
    """The cancellation's own locking read, run by hand in a transaction left open."""
    holder = connect_as(Role.APP, autocommit=False)
    found = holder.execute(connector.text("cancellation_lock_job"),
                           dict(job_id=job.id, tenant_id=job.tenant_id)).fetchone()
    assert found is not None
    return holder


# --- every outcome, with what it found -----------------------------------------------------------


def test_a_queued_job_is_canceled_and_the_request_records_what_it_found(conn, admin, seed):
    job = seed.queued()
    request_id = uuid.uuid4()

    result = cancel(conn, job, request_id, reason="wrong list")

    assert result.reply is CancellationReply.RECORDED
    assert result.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED
    row = seed.row(job)
    assert row["status"] == "Canceled" and row["cancellation_request_id"] == request_id
    [record] = records(admin)
    assert record["id"] == request_id and record["job_id"] == job.id and record["requested_by"] == "op-1"
    assert record["reason"] == "wrong list"
    assert (record["outcome"], record["found_status"], record["found_attempt_id"], record["found_attempt_count"],
            record["found_delivery_authorized_at"]) == ("CanceledWhileQueued", "Queued", None, 0, None)


def test_a_running_job_gets_a_stop_request_and_keeps_running(conn, admin, seed):
    job = seed.running()
    request_id = uuid.uuid4()

    result = cancel(conn, job, request_id)

    assert result.outcome is CancellationOutcome.STOP_REQUESTED
    assert (result.found_status, result.found_attempt_id, result.found_attempt_count) == (
        Status.RUNNING, job.attempt_id, 1)
    row = seed.row(job)
    assert row["status"] == "Running" and row["stop_request_id"] == request_id
    assert row["attempt_id"] == job.attempt_id
    [record] = records(admin)
    assert (record["outcome"], record["found_status"], record["found_attempt_id"], record["found_attempt_count"]) == (
        "StopRequested", "Running", job.attempt_id, 1)


def test_a_second_stop_request_is_recorded_and_the_first_one_stands(conn, admin, seed):
    job = seed.running()
    first = uuid.uuid4()
    cancel(conn, job, first)
    before = seed.row(job)

    result = cancel(conn, job, uuid.uuid4(), requested_by="op-2")

    assert result.outcome is CancellationOutcome.STOP_ALREADY_REQUESTED
    assert seed.row(job) == before and before["stop_request_id"] == first
    assert [r["outcome"] for r in records(admin)] == ["StopRequested", "StopAlreadyRequested"]


def test_a_canceled_job_answers_already_canceled(conn, admin, seed):
    job = seed.queued()
    cancel(conn, job)
    before = seed.row(job)

    result = cancel(conn, job, uuid.uuid4())

    assert result.outcome is CancellationOutcome.ALREADY_CANCELED
    assert seed.row(job) == before
    assert [(r["outcome"], r["found_status"]) for r in records(admin)] == [
        ("CanceledWhileQueued", "Queued"), ("AlreadyCanceled", "Canceled")]


def _rejected(seed, conn):
    job = seed.queued()
    assert export.reject(conn, job_id=job.id, checked_version=1)
    return job


def _stopped(seed, conn):
    job = seed.running()
    cancel(conn, job)
    assert export.try_finish_stopped(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                     stop_point="build") == 1
    return job


def _failed(seed, conn):
    job = seed.running()
    assert export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                  failure_reason=FailureCode.BUILD_FAILED) == 1
    return job


@pytest.mark.parametrize("make", [_rejected, _stopped, _failed], ids=["Rejected", "Stopped", "Failed"])
def test_an_ended_job_answers_already_ended_and_stays_as_it_ended(conn, admin, seed, make):
    job = make(seed, conn)
    before = seed.row(job)
    request_id = uuid.uuid4()

    result = cancel(conn, job, request_id)

    assert result.outcome is CancellationOutcome.ALREADY_ENDED
    assert result.found_status is Status(before["status"])
    assert seed.row(job) == before
    record = admin.execute("SELECT * FROM cancellation_requests WHERE id = %s", (request_id,)).fetchone()
    assert (record["outcome"], record["found_status"], record["found_attempt_id"], record["found_attempt_count"]) == (
        "AlreadyEnded", before["status"], before["attempt_id"], before["attempt_count"])


@pytest.mark.parametrize("make", [
    lambda seed: seed.delivering(),
    lambda seed: seed.finished(Status.COMPLETED),
    lambda seed: seed.finished(Status.OUTCOME_UNKNOWN),
], ids=["Delivering", "Completed", "OutcomeUnknown"])
def test_a_job_past_cutoff_2_answers_too_late_and_records_when_delivery_was_authorized(conn, admin, seed, make):
    job = make(seed)
    before = seed.row(job)

    result = cancel(conn, job)

    assert result.outcome is CancellationOutcome.TOO_LATE
    assert seed.row(job) == before
    [record] = records(admin)
    assert record["outcome"] == "TooLate" and record["found_status"] == before["status"]
    assert record["found_attempt_id"] == job.attempt_id
    assert record["found_delivery_authorized_at"] == before["delivery_authorized_at"] is not None


# --- the request id ------------------------------------------------------------------------------


def test_two_simultaneous_submissions_of_one_click_record_one_request_and_get_the_same_answer(
        connect_as, admin, seed, threads):
    job = seed.queued()
    request_id = uuid.uuid4()
    holder = hold_row_lock(connect_as, job)
    submitters = [connect_as(Role.APP), connect_as(Role.APP)]

    futures: list[Future] = [
        threads.submit(cancel, c, job, request_id, lock_timeout=PATIENT) for c in submitters]
    for c in submitters:
        wait_until_blocked(admin, c.info.backend_pid)
    holder.commit()
    first, second = (f.result(timeout=10) for f in futures)

    # The same answer; the one that came second says it is a replay of the recorded request.
    assert [r.replay_of is not None for r in (first, second)].count(True) == 1
    assert dataclasses.replace(first, replay_of=None) == dataclasses.replace(second, replay_of=None)
    assert first.reply is CancellationReply.RECORDED and first.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED
    assert [r["id"] for r in records(admin)] == [request_id]
    assert seed.row(job)["cancellation_request_id"] == request_id


def test_a_request_id_reused_for_another_job_is_refused_and_changes_nothing(conn, admin, seed):
    first_job = seed.queued()
    other_job = seed.queued(first_job.tenant_id, first_job.destination_id)
    request_id = uuid.uuid4()
    cancel(conn, first_job, request_id)
    other_before = seed.row(other_job)

    result = cancel(conn, other_job, request_id)

    assert result.reply is CancellationReply.REQUEST_ID_REUSED and result.outcome is None
    assert seed.row(other_job) == other_before
    assert [r["job_id"] for r in records(admin)] == [first_job.id]


def test_one_request_id_submitted_for_two_jobs_at_once_is_recorded_once_and_refused_for_the_other(
        connect_as, admin, seed, threads):
    first_job = seed.queued()
    second_job = seed.queued(first_job.tenant_id, first_job.destination_id)
    request_id = uuid.uuid4()
    # The first submission, by hand, up to its insert: it holds the request id's key, uncommitted.
    first = connect_as(Role.APP, autocommit=False)
    keys = dict(job_id=first_job.id, tenant_id=first_job.tenant_id, request_id=request_id)
    found = first.execute(connector.text("cancellation_lock_job"), keys).fetchone()
    assert first.execute(connector.text("cancellation_find_request"), keys).fetchone() is None
    assert first.execute(connector.text("cancellation_cancel_queued"), keys).rowcount == 1
    first.execute(connector.text("cancellation_record"), dict(
        keys, requested_by="op-1", reason=None, outcome="CanceledWhileQueued", found_status="Queued",
        found_attempt_id=None, found_attempt_count=found["attempt_count"], found_delivery_authorized_at=None))
    second = connect_as(Role.APP)

    # The second locks another job, finds no committed request, and waits on the unique key.
    answer = threads.submit(cancel, second, second_job, request_id, lock_timeout=PATIENT)
    wait_until_blocked(admin, second.info.backend_pid, by=first.info.backend_pid)
    first.commit()

    assert answer.result(timeout=10).reply is CancellationReply.REQUEST_ID_REUSED
    assert seed.status(second_job) is Status.QUEUED   # its cancellation rolled back with the insert
    assert [(r["id"], r["job_id"]) for r in records(admin)] == [(request_id, first_job.id)]


def test_a_request_id_reused_by_another_operator_is_refused(conn, admin, seed):
    job = seed.running()
    request_id = uuid.uuid4()
    cancel(conn, job, request_id, requested_by="op-1")

    result = cancel(conn, job, request_id, requested_by="op-2")

    assert result.reply is CancellationReply.REQUEST_ID_REUSED
    assert [r["requested_by"] for r in records(admin)] == ["op-1"]


def test_a_repeated_click_is_answered_from_the_record_even_after_the_job_moved_on(conn, admin, seed):
    job = seed.queued()
    request_id = uuid.uuid4()
    first = cancel(conn, job, request_id, reason="first")

    again = cancel(conn, job, request_id, reason="second")

    assert first.replay_of is None and again.replay_of is not None
    assert dataclasses.replace(again, replay_of=None) == first
    assert again.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED
    [record] = records(admin)
    assert record["reason"] == "first"


def test_the_same_request_id_in_another_tenant_is_a_different_request(conn, admin, seed):
    job = seed.queued()
    other_tenants_job = seed.queued()
    request_id = uuid.uuid4()
    cancel(conn, job, request_id)

    result = cancel(conn, other_tenants_job, request_id)

    assert result.reply is CancellationReply.RECORDED
    assert result.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED
    assert seed.status(other_tenants_job) is Status.CANCELED
    assert sorted((r["tenant_id"], r["job_id"]) for r in records(admin)) == sorted(
        [(job.tenant_id, job.id), (other_tenants_job.tenant_id, other_tenants_job.id)])


def test_a_request_for_a_missing_job_is_not_found_and_records_nothing(conn, admin, seed):
    tenant = seed.tenant()

    result = request_cancellation(conn, tenant_id=tenant, job_id=uuid.uuid4(), request_id=uuid.uuid4(),
                                  requested_by="op-1")

    assert result.reply is CancellationReply.NOT_FOUND
    assert records(admin) == []


def test_a_request_for_another_tenants_job_is_not_found_and_changes_nothing(conn, admin, seed):
    job = seed.running()
    before = seed.row(job)

    result = cancel(conn, job, tenant_id=seed.tenant("Other"))

    assert result.reply is CancellationReply.NOT_FOUND
    assert seed.row(job) == before
    assert records(admin) == []


# --- the row lock --------------------------------------------------------------------------------


def test_a_cancellation_that_outwaits_lock_timeout_is_busy_records_nothing_and_succeeds_on_retry(
        connect_as, conn, admin, seed):
    job = seed.queued()
    request_id = uuid.uuid4()
    holder = hold_row_lock(connect_as, job)

    busy = cancel(conn, job, request_id, lock_timeout="200ms")

    assert busy.reply is CancellationReply.BUSY and busy.outcome is None
    assert records(admin) == []
    holder.commit()
    assert seed.status(job) is Status.QUEUED

    retried = cancel(conn, job, request_id, lock_timeout="200ms")

    assert retried.reply is CancellationReply.RECORDED
    assert retried.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED
    assert [r["id"] for r in records(admin)] == [request_id]


def test_a_claim_waits_for_a_cancellations_row_lock_then_matches_nothing(connect_as, admin, seed, threads):
    job = seed.queued()
    request_id = uuid.uuid4()
    keys = dict(job_id=job.id, tenant_id=job.tenant_id, request_id=request_id)
    canceler = connect_as(Role.APP, autocommit=False)
    assert canceler.execute(connector.text("cancellation_lock_job"), keys).fetchone()["status"] == "Queued"
    worker = connect_as(Role.APP)

    claim = threads.submit(export.try_claim, worker, job_id=job.id, checked_version=1, attempt_id=uuid.uuid4(),
                           worker_id="w1", lease_seconds=60)
    wait_until_blocked(admin, worker.info.backend_pid, by=canceler.info.backend_pid)
    assert not claim.done()

    # What the cancellation found stays true until it commits: the job is Queued, and it cancels it.
    assert canceler.execute(connector.text("cancellation_cancel_queued"), keys).rowcount == 1
    canceler.commit()

    assert claim.result(timeout=10) == 0
    row = seed.row(job)
    assert row["status"] == "Canceled" and row["attempt_count"] == 0
    assert seed.events(job) == []


def test_a_claim_waits_for_a_cancellations_row_lock_then_claims_if_the_job_is_still_queued(
        connect_as, admin, seed, threads):
    job = seed.queued()
    canceler = hold_row_lock(connect_as, job)
    worker = connect_as(Role.APP)
    attempt_id = uuid.uuid4()

    claim = threads.submit(export.try_claim, worker, job_id=job.id, checked_version=1, attempt_id=attempt_id,
                           worker_id="w1", lease_seconds=60)
    wait_until_blocked(admin, worker.info.backend_pid, by=canceler.info.backend_pid)
    assert not claim.done()
    canceler.commit()

    assert claim.result(timeout=10) == 1
    assert seed.row(job)["attempt_id"] == attempt_id


def test_cancel_waits_for_claim_row_lock_then_reports_stop_requested(connect_as, admin, seed, threads):
    job = seed.queued()
    attempt_id = uuid.uuid4()
    worker = connect_as(Role.APP, autocommit=False)
    assert export.try_claim(worker, job_id=job.id, checked_version=1, attempt_id=attempt_id, worker_id="w1",
                          lease_seconds=60) == 1
    operator = connect_as(Role.APP)
    request_id = uuid.uuid4()

    result = threads.submit(cancel, operator, job, request_id, lock_timeout=PATIENT)
    wait_until_blocked(admin, operator.info.backend_pid, by=worker.info.backend_pid)
    assert not result.done()
    worker.commit()

    answer = result.result(timeout=10)
    assert answer.outcome is CancellationOutcome.STOP_REQUESTED
    assert (answer.found_attempt_id, answer.found_attempt_count) == (attempt_id, 1)
    row = seed.row(job)
    assert row["status"] == "Running" and row["stop_request_id"] == request_id


# --- the wake-up ---------------------------------------------------------------------------------


def test_a_stop_request_notifies_exports_stop_with_the_job_id_once(connect_as, conn, admin, seed):
    job = seed.running()
    listener = connect_as(Role.APP)
    listener.execute("LISTEN exports_stop")

    cancel(conn, job)
    cancel(conn, job)   # StopAlreadyRequested: the first request stands, nothing to wake
    # Notifications arrive in commit order, so everything the two requests sent precedes this one.
    admin.execute("SELECT pg_notify('exports_stop', 'sentinel')")

    payloads: list[str] = []
    for note in listener.notifies(timeout=10):
        payloads.append(note.payload)
        if note.payload == "sentinel":
            break
    assert payloads == [str(job.id), "sentinel"]
