"""The lease keeper on its own and inside a build: failures are retried, renewals are serialized on
the keeper's one connection, and the end of an attempt is never reported as a lost lease."""

from __future__ import annotations

from itertools import pairwise

import psycopg
import pytest
from psycopg.rows import dict_row

from app.actors.lease import Leases, new_scheduler
from app.actors.runner import RunOutcome
from app.actors.stop import StopSignal
from app.store import export, recovery
from app.store.types import FailureCode, RenewResult, Status, WriteResult
from exports_devtools.waiting import wait_until
from tests.fixtures.worker import Gate, lease_backends_blocked
from tests.support import Background


@pytest.fixture
def scheduler():
    scheduler = new_scheduler()
    yield scheduler
    scheduler.shutdown(wait=False)


@pytest.fixture
def locker(db_url):
    """The owner in an explicit transaction, to hold a job's row lock while a renewal waits on it."""
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        yield conn


def _keeper(db_url, scheduler, job, *, renew_seconds):
    stop = StopSignal()
    keeper = Leases(db_url, lease_seconds=30, renew_seconds=renew_seconds, scheduler=scheduler).keep(
        job.id, job.attempt_id, stop)
    return keeper, stop


def test_a_renewal_that_throws_is_retried_at_the_next_interval_and_does_not_stop_a_healthy_build(worker):
    job = worker.queued()
    gate = Gate()
    runner = worker.runner(checkpoint=gate, lease_seconds=30, renew_seconds=0.2)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    keeper = runner.leases.keeper
    wait_until(lambda: keeper.renewals >= 1, "a first renewal")

    # Hold the row so a renewal waits on it, then kill that renewal's session: it raises mid-statement.
    locker = psycopg.connect(worker.db_url, autocommit=False)
    try:
        locker.execute("SELECT 1 FROM export_jobs WHERE id = %s FOR UPDATE", (job.id,))
        wait_until(lambda: lease_backends_blocked(worker.admin) == 1, "a renewal blocked on the row lock")
        killed = worker.admin.execute(
            "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'exports-lease' AND cardinality(pg_blocking_pids(pid)) > 0").fetchone()["n"]
        assert killed == 1
        wait_until(lambda: keeper.failures >= 1, "a failed renewal")
    finally:
        locker.rollback()
        locker.close()
    failed_at = max(i for i, r in enumerate(keeper.history) if r.result is RenewResult.FAILED)
    wait_until(lambda: any(r.result is RenewResult.RENEWED for r in keeper.history[failed_at + 1:]),
               "a renewal after the failure, on another connection")
    assert not keeper._stop.is_set()
    gate.open()
    result = run.result()

    assert (result.outcome, result.delivery, result.write) == (RunOutcome.DELIVERED, Status.COMPLETED,
                                                               WriteResult.WRITTEN)
    assert not keeper.lost


def test_an_on_demand_renewal_overlapping_a_scheduled_one_waits_for_it_instead_of_running_beside_it(
        seed, admin, db_url, scheduler, locker):
    job = seed.running()
    untouched = seed.running()
    keeper, stop = _keeper(db_url, scheduler, job, renew_seconds=0.2)
    wait_until(lambda: keeper.renewals >= 1, "a first scheduled renewal")
    before = seed.row(untouched)["lease_expires_at"]

    locker.execute("SELECT 1 FROM export_jobs WHERE id = %s FOR UPDATE", (job.id,))
    wait_until(lambda: lease_backends_blocked(admin) == 1, "a scheduled renewal blocked on the row lock")
    scheduled_in_flight = len(keeper.history)
    on_demand = Background(keeper.renew_now)
    assert keeper.on_demand_waiting.wait(60)
    # Still exactly one keeper statement at the server: the on-demand one waits on the keeper's lock.
    assert lease_backends_blocked(admin) == 1 and len(keeper.history) == scheduled_in_flight
    locker.commit()

    assert on_demand.result() is RenewResult.RENEWED
    keeper.finish()
    scheduled = keeper.history[scheduled_in_flight]
    first_on_demand = next(r for r in keeper.history if r.kind == "on-demand")
    assert scheduled.kind == "scheduled" and scheduled.ended <= first_on_demand.started
    ordered = sorted(keeper.history, key=lambda r: r.started)
    assert all(a.ended <= b.started for a, b in pairwise(ordered))   # never two at once
    assert not stop.is_set()
    assert seed.row(untouched)["lease_expires_at"] == before


def test_a_renewal_in_flight_at_finish_that_finds_no_row_is_not_reported_as_lost_ownership(
        seed, admin, db_url, scheduler, locker):
    job = seed.running()
    keeper, stop = _keeper(db_url, scheduler, job, renew_seconds=0.2)
    wait_until(lambda: keeper.renewals >= 1, "a first scheduled renewal")

    # The attempt's terminal write holds the row while a scheduled renewal waits behind it.
    assert export.try_finish_failed(locker, job_id=job.id, attempt_id=job.attempt_id, worker_id="worker-test",
                                  failure_reason=FailureCode.BUILD_FAILED) == 1
    wait_until(lambda: lease_backends_blocked(admin) == 1, "a scheduled renewal blocked on the terminal write")
    finishing = Background(keeper.finish)
    wait_until(lambda: keeper._finished.is_set(), "finish() to start waiting for the renewal")
    assert not finishing.done
    locker.commit()
    finishing.result()

    assert keeper.history[-1].result is RenewResult.LOST   # the renewal did find no row...
    assert not keeper.lost and not stop.is_set()           # ...and reported nothing
    assert seed.status(job) is Status.FAILED
    count = len(keeper.history)
    wait_until(lambda: scheduler.get_jobs() == [], "the schedule to be gone")
    assert len(keeper.history) == count


def test_a_renewal_released_by_the_attempts_own_terminal_write_before_finish_is_not_reported_as_lost(
        seed, admin, db_url, scheduler, locker):
    # The CI failure this specifies: the terminal write committed, the renewal waiting behind it found no
    # row, and the runner had not reached finish() yet.
    job = seed.running()
    keeper, stop = _keeper(db_url, scheduler, job, renew_seconds=0.2)
    wait_until(lambda: keeper.renewals >= 1, "a first scheduled renewal")

    keeper.ending()
    assert export.try_finish_failed(locker, job_id=job.id, attempt_id=job.attempt_id, worker_id="worker-test",
                                  failure_reason=FailureCode.BUILD_FAILED) == 1
    wait_until(lambda: lease_backends_blocked(admin) == 1, "a scheduled renewal blocked on the terminal write")
    locker.commit()
    wait_until(lambda: keeper.history[-1].result is RenewResult.LOST, "the renewal to find no row")

    assert not keeper.lost and not stop.is_set()   # finish() has not been called: ending() was enough
    keeper.finish()
    assert seed.status(job) is Status.FAILED


def test_a_renewal_that_finds_no_row_before_finish_reports_the_lost_lease(seed, db_url, scheduler):
    job = seed.running()
    keeper, stop = _keeper(db_url, scheduler, job, renew_seconds=0.2)
    with seed.lease_expired(job):
        assert recovery.requeue_expired(seed.conn, [(job.id, job.attempt_id)], max_attempts=5, recovery_run_id="r")

    assert stop.wait(60)
    assert keeper.lost and stop.reason.value == "LeaseLost"
    keeper.finish()
