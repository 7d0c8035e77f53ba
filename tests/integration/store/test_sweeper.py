"""The sweeper (`sweeper_republish_due`): the backstop for a queued job whose only wake-up was lost.

Every test seeds a control row that must not change and asserts on it too.
"""

from __future__ import annotations

import uuid

import pytest

from app.store import connector, sweeper
from app.store.cancellation import request_cancellation
from app.store.types import CancellationOutcome, Role

#: The production threshold: above the longest legitimate queue wait.
SWEEP_AFTER_SECONDS = 30 * 60


@pytest.fixture
def conn(conn):
    # A sweep that waited on a held row instead of skipping it would fail here rather than hang.
    conn.execute("SET statement_timeout = '5s'")
    return conn


def sweep(conn, batch_size: int = 500) -> list[uuid.UUID]:
    return [r.job_id for r in sweeper.republish_due(conn, sweep_after_seconds=SWEEP_AFTER_SECONDS,
                                                      batch_size=batch_size)]


def message_ids(seed, job) -> list[uuid.UUID]:
    return [r["message_id"] for r in seed.outbox(job)]


def test_a_queued_job_woken_31_minutes_ago_gets_a_new_wakeup_with_a_new_message_id(conn, seed):
    job = seed.queued()
    seed.age_wakeup(job, 31)
    before = seed.row(job)
    [first_message] = message_ids(seed, job)

    assert sweep(conn) == [job.id]

    after = seed.row(job)
    assert after["status"] == "Queued"
    assert after["woken_at"] > before["woken_at"]
    assert after["sweep_count"] == before["sweep_count"] + 1
    messages = message_ids(seed, job)
    assert len(messages) == 2 and messages[0] == first_message and messages[1] != first_message


def test_a_sweep_names_each_jobs_tenant_and_its_new_wake_ups_message_id_for_the_sweepers_log_line(conn, seed):
    job = seed.queued()
    seed.age_wakeup(job, 31)

    [republished] = sweeper.republish_due(conn, sweep_after_seconds=SWEEP_AFTER_SECONDS)

    assert (republished.job_id, republished.tenant_id) == (job.id, seed.row(job)["tenant_id"])
    assert republished.message_id == message_ids(seed, job)[-1]


def test_a_queued_job_woken_29_minutes_ago_is_left_alone(conn, seed):
    control = seed.queued()
    seed.age_wakeup(control, 29)
    before, outbox_before = seed.row(control), seed.outbox(control)

    assert sweep(conn) == []

    assert seed.row(control) == before
    assert seed.outbox(control) == outbox_before


def test_a_job_whose_claim_holds_the_row_during_the_sweep_is_skipped_and_gets_no_wakeup(connect_as, conn, seed):
    job = seed.queued()
    seed.age_wakeup(job, 31)
    other = seed.queued()
    seed.age_wakeup(other, 31)

    worker = connect_as(Role.APP, autocommit=False)
    claimed = worker.execute(connector.text("export_claim"), dict(
        job_id=job.id, checked_version=1, attempt_id=uuid.uuid4(), worker_id="w1", lease_seconds=60)).rowcount
    assert claimed == 1   # uncommitted: the claim holds the row lock while the sweep runs

    # SKIP LOCKED: the sweep neither waits for the claim nor republishes the row it is changing.
    assert sweep(conn) == [other.id]
    worker.commit()

    # The claim committed, so the job left Queued: the next sweep has nothing to do for it.
    assert sweep(conn) == []
    row = seed.row(job)
    assert row["status"] == "Running" and row["sweep_count"] == 0
    assert len(seed.outbox(job)) == 1


def test_a_job_canceled_before_the_sweep_gets_no_wakeup(conn, seed):
    job = seed.queued()
    seed.age_wakeup(job, 31)
    control = seed.queued()
    seed.age_wakeup(control, 29)
    control_before = seed.row(control)

    result = request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(),
                                  requested_by="op")
    assert result.outcome is CancellationOutcome.CANCELED_WHILE_QUEUED

    assert sweep(conn) == []
    assert seed.row(job)["sweep_count"] == 0
    assert len(seed.outbox(job)) == 1
    assert seed.row(control) == control_before


def test_a_row_locked_by_a_cancellation_is_skipped_then_picked_up_by_the_next_sweep(connect_as, conn, seed):
    job = seed.queued()
    seed.age_wakeup(job, 31)

    # The cancellation's locking read, held open: a cancellation that has not decided yet.
    canceler = connect_as(Role.APP, autocommit=False)
    locked = canceler.execute(connector.text("cancellation_lock_job"),
                              dict(job_id=job.id, tenant_id=job.tenant_id)).fetchone()
    assert locked["status"] == "Queued"

    assert sweep(conn) == []
    assert seed.row(job)["sweep_count"] == 0
    assert len(seed.outbox(job)) == 1

    canceler.commit()   # it changed nothing (e.g. the request was a retry already recorded)

    assert sweep(conn) == [job.id]
    assert seed.row(job)["sweep_count"] == 1
    assert len(seed.outbox(job)) == 2


def test_a_row_locked_by_a_cancellation_that_then_cancels_it_is_never_republished(connect_as, conn, seed):
    job = seed.queued()
    seed.age_wakeup(job, 31)
    request_id = uuid.uuid4()

    canceler = connect_as(Role.APP, autocommit=False)
    keys = dict(job_id=job.id, tenant_id=job.tenant_id, request_id=request_id)
    assert canceler.execute(connector.text("cancellation_lock_job"), keys).fetchone()["status"] == "Queued"
    assert sweep(conn) == []
    assert canceler.execute(connector.text("cancellation_cancel_queued"), keys).rowcount == 1
    canceler.commit()

    assert sweep(conn) == []
    row = seed.row(job)
    assert row["status"] == "Canceled" and row["sweep_count"] == 0
    assert len(seed.outbox(job)) == 1


def test_a_sweep_republishes_at_most_batch_size_jobs_oldest_first(conn, seed):
    tenant = seed.tenant()
    destination = seed.destination(tenant)
    by_age = {}
    for minutes in (33, 35, 31, 34, 32):
        job = seed.queued(tenant, destination)
        seed.age_wakeup(job, minutes)
        by_age[minutes] = job.id
    control = seed.queued(tenant, destination)
    seed.age_wakeup(control, 29)
    control_before = seed.row(control)

    # Within a batch the order of the returned ids is not specified; across batches it is by age.
    assert set(sweep(conn, batch_size=2)) == {by_age[35], by_age[34]}
    assert set(sweep(conn, batch_size=2)) == {by_age[33], by_age[32]}
    assert sweep(conn, batch_size=2) == [by_age[31]]
    assert sweep(conn, batch_size=2) == []
    assert seed.row(control) == control_before


def test_each_republication_increments_sweep_count_and_writes_its_own_message(conn, seed):
    job = seed.queued()
    for expected_count in (1, 2, 3):
        seed.age_wakeup(job, 31)
        assert sweep(conn) == [job.id]
        assert seed.row(job)["sweep_count"] == expected_count

    messages = message_ids(seed, job)
    assert len(messages) == 4 and len(set(messages)) == 4
