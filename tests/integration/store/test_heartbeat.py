"""Process heartbeats: a conditional upsert per beat, a clean stop that sticks, the attempts a worker holds."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from app.heartbeat import Heartbeat
from app.store import export, heartbeat
from app.store.heartbeat import ProcessIdentity
from app.store.types import Role


def _identity(process_id: str = "host-a:4242", role: str = "worker") -> ProcessIdentity:
    host, pid = process_id.split(":")
    return ProcessIdentity(process_id, role, host, int(pid), "1.0", datetime.now(UTC))


def test_a_beat_records_the_process_and_a_later_beat_moves_its_time_only(conn):
    me = _identity()
    assert heartbeat.beat(conn, me)
    [first] = heartbeat.processes(conn)
    assert heartbeat.beat(conn, me)
    [second] = heartbeat.processes(conn)

    assert first.identity == second.identity == me
    assert second.beat_at > first.beat_at and second.stopped_at is None


def test_a_beat_after_a_clean_stop_changes_nothing(conn):
    me = _identity()
    heartbeat.beat(conn, me)
    assert heartbeat.stop(conn, me)

    assert heartbeat.beat(conn, me) is False
    [record] = heartbeat.processes(conn)
    assert record.stopped_at is not None


def test_a_process_that_reuses_a_stopped_processs_pid_takes_its_row_over_and_the_old_ones_late_beat_changes_nothing(
        conn):
    old = _identity()
    heartbeat.beat(conn, old)
    heartbeat.stop(conn, old)
    reborn = dataclasses.replace(old, role="relay", started_at=datetime.now(UTC))

    assert heartbeat.beat(conn, reborn)
    assert heartbeat.beat(conn, old) is False
    [record] = heartbeat.processes(conn)
    assert record.identity == reborn and record.stopped_at is None


def test_a_process_that_reuses_a_silent_processs_pid_takes_its_row_over(conn):
    old = _identity()
    heartbeat.beat(conn, old)   # never stopped: it died, and the container came back as the same host:pid
    reborn = dataclasses.replace(old, started_at=datetime.now(UTC))

    assert heartbeat.beat(conn, reborn)
    [record] = heartbeat.processes(conn)
    assert record.identity == reborn


def test_a_process_that_started_earlier_under_the_same_id_cannot_take_a_newer_row_back(conn):
    newer = _identity()
    older = dataclasses.replace(newer, started_at=datetime(2020, 1, 1, tzinfo=UTC))
    heartbeat.beat(conn, newer)

    assert heartbeat.beat(conn, older) is False
    [record] = heartbeat.processes(conn)
    assert record.identity == newer


def test_a_worker_lists_the_attempts_it_holds_and_another_process_none(conn, seed):
    worker, other = _identity("host-a:4242"), _identity("host-b:1", "scheduler")
    job, attempt_id = seed.queued(), uuid.uuid4()
    assert export.try_claim(conn, job_id=job.id, checked_version=1, attempt_id=attempt_id,
                            worker_id=f"{worker.process_id}:140001", lease_seconds=60) == 1
    heartbeat.beat(conn, worker)
    heartbeat.beat(conn, other)

    attempts = {r.identity.process_id: r.attempts for r in heartbeat.processes(conn)}
    assert attempts == {worker.process_id: (attempt_id,), other.process_id: ()}


def test_the_relays_role_may_beat_too(connect_as):
    dispatcher = connect_as(Role.DISPATCHER)

    assert heartbeat.beat(dispatcher, _identity("relay-host:7", "relay"))


def test_the_heartbeat_thread_beats_at_once_and_records_its_stop(app_db, conn):
    beating = Heartbeat(app_db, "scheduler", interval_seconds=3600)
    assert beating.beat_once()

    beating.stop()

    [record] = heartbeat.processes(conn)
    assert record.identity.role == "scheduler" and record.stopped_at is not None


def test_a_worker_process_records_the_pid_to_signal_and_a_process_taking_its_row_over_records_its_own(conn):
    me = dataclasses.replace(_identity(), parent_pid=100)
    heartbeat.beat(conn, me)
    [first] = heartbeat.processes(conn)
    successor = dataclasses.replace(me, started_at=datetime.now(UTC), parent_pid=200)
    heartbeat.beat(conn, successor)
    [second] = heartbeat.processes(conn)

    assert (first.identity.parent_pid, second.identity.parent_pid) == (100, 200)


def test_a_worker_names_its_parent_as_the_process_to_signal_and_the_other_roles_name_none():
    import os

    from app.heartbeat import identity

    assert identity("worker").parent_pid == os.getppid()
    assert [identity(role).parent_pid for role in ("relay", "scheduler", "notifier")] == [None, None, None]
