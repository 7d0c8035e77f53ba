"""The stop watcher: a notification is only a hint confirmed against the row, and polling finds a
stop request whose notification never came."""

from __future__ import annotations

import threading
import uuid

import pytest

from app.actors.stop import StopReason, StopSignal
from app.actors.watcher import StopWatcher
from app.store import cancellation
from exports_devtools.waiting import wait_until


@pytest.fixture
def watcher_factory(db_url):
    made = []

    def make(**kwargs) -> StopWatcher:
        made.append(StopWatcher(db_url, **kwargs))
        return made[-1]

    yield make
    for watcher in made:
        watcher.close()


def _stop(conn, job):
    return cancellation.request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(),
                                             requested_by="ops-alice")


def test_polling_finds_a_stop_request_whose_notification_was_missed(seed, admin, watcher_factory):
    job, other = seed.running(), seed.running()
    watcher = watcher_factory(poll_seconds=0.2)
    stop, other_stop = StopSignal(), StopSignal()
    watcher.watch(job.id, job.attempt_id, stop)
    watcher.watch(other.id, other.attempt_id, other_stop)
    wait_until(lambda: watcher.polls >= 1, "the first check")

    # Recorded with triggers off for this transaction: no notification is ever sent.
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("UPDATE export_jobs SET stop_request_id = %s WHERE id = %s", (uuid.uuid4(), job.id))

    assert stop.wait(60)
    assert stop.reason is StopReason.STOP_REQUESTED
    assert (watcher.confirmed_by_poll, watcher.confirmed_by_notify) == (1, 0)
    assert not other_stop.is_set()


def test_a_confirmed_stop_is_counted_before_the_signal_wakes_anyone(seed, conn, watcher_factory):
    """set() runs the signal's callbacks (the builder's query cancel) after it wakes the waiters, so
    a runner can end, and a test read the counters, while the watcher is still inside set()."""
    job = seed.running()
    watcher = watcher_factory(poll_seconds=60)
    stop = StopSignal()
    in_callback, release = threading.Event(), threading.Event()
    stop.on_set(lambda _reason: (in_callback.set(), release.wait(10)))   # held like a slow cancel
    watcher.watch(job.id, job.attempt_id, stop)
    wait_until(lambda: watcher.polls >= 1, "the first check")
    try:
        _stop(conn, job)
        assert stop.wait(60) and in_callback.wait(60)
        # The watcher is held inside set(): a waiter that saw the signal must already see the count.
        assert (watcher.confirmed_by_notify, watcher.confirmed_by_poll) == (1, 0)
    finally:
        release.set()


def test_a_notification_the_row_does_not_confirm_sets_no_stop(seed, conn, watcher_factory):
    unstopped, stale, stopped = seed.running(), seed.running(), seed.running()
    watcher = watcher_factory(poll_seconds=60)
    signals = {job.id: StopSignal() for job in (unstopped, stale, stopped)}
    watcher.watch(unstopped.id, unstopped.attempt_id, signals[unstopped.id])
    watcher.watch(stale.id, uuid.uuid4(), signals[stale.id])   # an attempt that no longer owns the job
    watcher.watch(stopped.id, stopped.attempt_id, signals[stopped.id])
    wait_until(lambda: watcher.polls >= 1, "the first check")

    conn.execute("SELECT pg_notify('exports_stop', %s)", (str(unstopped.id),))   # a hint with no request behind it
    _stop(conn, stale)
    _stop(conn, stopped)   # notified last: once it is confirmed, the earlier two were handled

    assert signals[stopped.id].wait(60)
    assert watcher.confirmed_by_notify == 1
    assert not signals[unstopped.id].is_set() and not signals[stale.id].is_set()


def test_a_stop_request_recorded_before_the_watch_began_is_found_at_once(seed, conn, watcher_factory):
    job = seed.running()
    _stop(conn, job)   # its notification went to nobody
    watcher = watcher_factory(poll_seconds=60)
    stop = StopSignal()
    watcher.watch(job.id, job.attempt_id, stop)

    assert stop.wait(60) and stop.reason is StopReason.STOP_REQUESTED


def _counting_checks(monkeypatch) -> list[set]:
    """The jobs of each check of the rows from now on (a poll, or a confirmation of some)."""
    from app.store import worker as worker_reads

    checks, real = [], worker_reads.confirm_stops

    def counted(conn, attempts):
        checks.append(set(attempts))
        return real(conn, attempts)

    monkeypatch.setattr(worker_reads, "confirm_stops", counted)
    return checks


def test_a_listening_watchers_new_watch_costs_no_query_and_a_quiet_spell_no_poll(seed, watcher_factory, monkeypatch):
    first, second = seed.running(), seed.running()
    watcher = watcher_factory(poll_seconds=60)
    with watcher.watch(first.id, first.attempt_id, StopSignal()):
        wait_until(lambda: watcher.polls >= 1, "the first check, as it connected")
    checks = _counting_checks(monkeypatch)
    in_flight = watcher.watch(second.id, second.attempt_id, StopSignal())
    ticks = watcher.ticks
    wait_until(lambda: watcher.ticks >= ticks + 3, "the watcher's loop to go round with the watch registered")
    in_flight.close()

    assert checks == [] and watcher.polls == 1


def test_a_stop_notified_before_its_watch_was_registered_is_confirmed_at_registration(
        seed, conn, watcher_factory, monkeypatch):
    running, job = seed.running(), seed.running()
    watcher = watcher_factory(poll_seconds=60)
    watcher.watch(running.id, running.attempt_id, StopSignal())
    wait_until(lambda: watcher.polls >= 1, "the first check, as it connected")
    checks = _counting_checks(monkeypatch)

    _stop(conn, job)   # between the claim and the watch: nobody watches it yet
    ticks = watcher.ticks
    wait_until(lambda: watcher.ticks >= ticks + 3, "the watcher's loop to hear the notification")
    stop = StopSignal()
    watcher.watch(job.id, job.attempt_id, stop)

    assert stop.wait(60) and stop.reason is StopReason.STOP_REQUESTED
    assert checks == [{job.id}] and watcher.polls == 1
