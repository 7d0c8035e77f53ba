"""Paused and draining destinations, paused tenants, with the real store, runner and SFTP peer: a held
export is never claimed, the sweeper leaves it, and the resume's own statement wakes it to be delivered;
a drain lets the running attempt finish while a queued one waits, then pauses the destination."""

from __future__ import annotations

import psycopg
import pytest

from app.actors.runner import RunOutcome
from app.maintenance.sweeper import Sweeper, SweeperConfig
from app.store import pausing
from app.store.types import Status
from tests.fixtures.worker import Gate
from tests.support import Background

#: The sweeper republishes what waited longer than this; the tests age a held export's wake-up past it.
SWEEP_AFTER = 60.0


def _sweeper(worker) -> Sweeper:
    return Sweeper(worker.db, SweeperConfig(sweep_after_seconds=SWEEP_AFTER, batch_size=10))


def _pause(worker, by: str = "ops-alice") -> bool:
    return pausing.pause_destination(worker.conn, tenant_id=worker.tenant_id, destination_id=worker.destination_id,
                                     changed_by=by, reason="partner maintenance")


def _resume(worker) -> pausing.Resumed:
    return pausing.resume_destination(worker.conn, tenant_id=worker.tenant_id,
                                      destination_id=worker.destination_id, changed_by="ops-bob", reason=None)


def _events(worker) -> list[tuple[str, str, str | None]]:
    rows = worker.admin.execute("SELECT kind, changed_by, reason FROM directory_events WHERE tenant_id = %s"
                                " ORDER BY id", (worker.tenant_id,)).fetchall()
    return [(r["kind"], r["changed_by"], r["reason"]) for r in rows]


def test_a_paused_destinations_export_waits_unclaimed_through_a_sweep_and_is_delivered_after_resume(worker):
    assert _pause(worker)
    job = worker.queued()   # creating for a paused destination still queues it
    runner = worker.runner()

    held = runner.run(job.id)   # the worker receives the creation's wake-up

    assert held.outcome is RunOutcome.HELD
    row = worker.seed.row(job)
    assert (row["status"], row["attempt_count"], row["attempt_id"]) == ("Queued", 0, None)
    assert worker.seed.events(job) == []
    # Long past the sweeper's threshold, a sweep leaves it: only the resume wakes it.
    worker.seed.age_wakeup(job, minutes=90)
    wake_ups = len(worker.seed.outbox(job))
    assert _sweeper(worker).run_once().republished == 0
    assert len(worker.seed.outbox(job)) == wake_ups and worker.seed.row(job)["sweep_count"] == 0
    assert runner.run(job.id).outcome is RunOutcome.HELD

    resumed = _resume(worker)

    assert resumed == pausing.Resumed(resumed=True, woken=1)
    assert len(worker.seed.outbox(job)) == wake_ups + 1   # its fresh wake-up, written by the resume
    delivered = runner.run(job.id)
    assert (delivered.outcome, delivered.delivery) == (RunOutcome.DELIVERED, Status.COMPLETED)
    assert worker.seed.status(job) is Status.COMPLETED
    assert _events(worker) == [("Paused", "ops-alice", "partner maintenance"), ("Resumed", "ops-bob", None)]


def test_a_paused_tenants_exports_wait_and_its_resume_wakes_only_those_of_active_destinations(worker):
    other_destination = worker.seed.destination(worker.tenant_id)
    job = worker.queued()
    behind_paused_destination = worker.queued(other_destination)
    assert pausing.pause_destination(worker.conn, tenant_id=worker.tenant_id, destination_id=other_destination,
                                     changed_by="ops-alice", reason=None)
    assert pausing.pause_tenant(worker.conn, tenant_id=worker.tenant_id, changed_by="ops-alice", reason="audit")
    runner = worker.runner()

    assert runner.run(job.id).outcome is RunOutcome.HELD
    assert worker.seed.status(job) is Status.QUEUED
    # A second pause changes nothing and records nothing.
    assert not pausing.pause_tenant(worker.conn, tenant_id=worker.tenant_id, changed_by="ops-carol", reason=None)

    before = len(worker.seed.outbox(behind_paused_destination))
    resumed = pausing.resume_tenant(worker.conn, tenant_id=worker.tenant_id, changed_by="ops-bob", reason=None)

    assert resumed == pausing.Resumed(resumed=True, woken=1)
    assert len(worker.seed.outbox(behind_paused_destination)) == before   # its destination still holds it
    assert runner.run(behind_paused_destination.id).outcome is RunOutcome.HELD
    assert runner.run(job.id).delivery is Status.COMPLETED
    assert not pausing.resume_tenant(worker.conn, tenant_id=worker.tenant_id, changed_by="ops-bob",
                                     reason=None).resumed


def test_a_drain_lets_the_running_export_finish_while_a_queued_one_waits_then_pauses(worker):
    running = worker.queued()
    waiting = worker.queued()
    gate = Gate()
    runner = worker.runner(checkpoint=gate)
    run = Background(lambda: runner.run(running.id))
    assert gate.reached.wait(60)   # claimed and building, held at the gate

    assert pausing.drain_destination(worker.conn, tenant_id=worker.tenant_id, destination_id=worker.destination_id,
                                     changed_by="ops-alice", reason="key rotation")
    assert pausing.settle_drains(worker.conn, tenant_id=worker.tenant_id, destination_id=worker.destination_id) == []
    assert runner.run(waiting.id).outcome is RunOutcome.HELD
    assert _sweeper(worker).run_once().drained == 0
    pause = pausing.read_destination(worker.conn, tenant_id=worker.tenant_id, destination_id=worker.destination_id)
    assert pause is not None and (pause.state, pause.running, pause.queued) == (pausing.PauseState.DRAINING, 1, 1)

    gate.open()
    finished = run.result()

    assert (finished.outcome, finished.delivery) == (RunOutcome.DELIVERED, Status.COMPLETED)
    assert worker.seed.status(waiting) is Status.QUEUED and worker.seed.events(waiting) == []
    assert _sweeper(worker).run_once().drained == 1   # the scheduler's pass: nothing runs any more
    pause = pausing.read_destination(worker.conn, tenant_id=worker.tenant_id, destination_id=worker.destination_id)
    assert pause is not None and (pause.state, pause.paused_by, pause.running) == (pausing.PauseState.PAUSED,
                                                                                   "ops-alice", 0)
    assert _events(worker) == [("Draining", "ops-alice", "key rotation"), ("Drained", "ops-alice", "key rotation")]

    assert _resume(worker).woken == 1
    assert runner.run(waiting.id).delivery is Status.COMPLETED


def test_a_drain_of_a_destination_with_nothing_running_pauses_at_the_next_settle(worker):
    assert pausing.drain_destination(worker.conn, tenant_id=worker.tenant_id, destination_id=worker.destination_id,
                                     changed_by="ops-alice", reason=None)
    # Draining or paused already: a second drain matches nothing.
    assert not pausing.drain_destination(worker.conn, tenant_id=worker.tenant_id,
                                         destination_id=worker.destination_id, changed_by="ops-bob", reason=None)

    assert pausing.settle_drains(worker.conn, tenant_id=worker.tenant_id,
                                 destination_id=worker.destination_id) == [worker.destination_id]
    assert pausing.settle_drains(worker.conn) == []


def test_pause_and_resume_match_nothing_for_another_tenants_destination(worker):
    stranger = worker.seed.tenant("Stranger")

    assert not pausing.pause_destination(worker.conn, tenant_id=stranger, destination_id=worker.destination_id,
                                         changed_by="ops-mallory", reason=None)
    assert not pausing.drain_destination(worker.conn, tenant_id=stranger, destination_id=worker.destination_id,
                                         changed_by="ops-mallory", reason=None)
    assert _pause(worker)
    assert not pausing.resume_destination(worker.conn, tenant_id=stranger, destination_id=worker.destination_id,
                                          changed_by="ops-mallory", reason=None).resumed
    assert pausing.read_destination(worker.conn, tenant_id=stranger, destination_id=worker.destination_id) is None
    assert [kind for kind, _, _ in _events(worker)] == ["Paused"]


def test_a_resume_gives_no_wake_up_to_an_export_that_left_the_queue(worker):
    job = worker.seed.running(worker.queued())
    assert _pause(worker)
    before = len(worker.seed.outbox(job))

    assert _resume(worker) == pausing.Resumed(resumed=True, woken=0)
    assert len(worker.seed.outbox(job)) == before


@pytest.mark.parametrize("statement", ["UPDATE directory_events SET reason = 'rewritten'",
                                       "DELETE FROM directory_events"])
def test_directory_events_are_append_only_for_the_application_and_the_owner(worker, statement):
    assert _pause(worker)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        worker.conn.execute(statement)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="is not allowed"):
        worker.admin.execute(statement)
    assert [kind for kind, _, _ in _events(worker)] == ["Paused"]

