"""Heartbeat pruning through ``run_once()`` and its statement against real PostgreSQL: only the rows of
processes dead (stopped, or silent) for longer than the retention go; the live and the recently dead stay,
a beat in progress is neither waited for nor deleted, and a pruned process that beats is recorded again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from psycopg import errors as pg

from app.maintenance.heartbeats import HeartbeatPruner, PruneConfig, PruneCounts
from app.store import heartbeat
from app.store.heartbeat import ProcessIdentity
from app.store.types import Role

DAY = 86400.0
RETENTION = 7 * DAY
#: An hour, not the default 30 s, so the rows seeded either side of a boundary stay clear of it by half an
#: hour however slowly the test runs.
SILENT = 3600.0
CONFIG = PruneConfig(retention_seconds=RETENTION, silent_seconds=SILENT)


def _seed(admin, process_id: str, *, beat_ago: float, stopped_ago: float | None = None,
          started_ago: float | None = None) -> None:
    """A heartbeat row as a process that beat ``beat_ago`` seconds ago (and stopped ``stopped_ago`` ago)
    left it. The owner writes it: the statements stamp the database's clock, and these are days old."""
    host, pid = process_id.split(":")
    admin.execute("""
        INSERT INTO process_heartbeats (process_id, role, host, pid, version, started_at, beat_at, stopped_at)
        VALUES (%(id)s, 'worker', %(host)s, %(pid)s, '1.0',
                clock_timestamp() - make_interval(secs => %(started)s),
                clock_timestamp() - make_interval(secs => %(beat)s),
                clock_timestamp() - make_interval(secs => %(stopped)s))""",
                  dict(id=process_id, host=host, pid=int(pid), beat=beat_ago, stopped=stopped_ago,
                       started=started_ago if started_ago is not None else beat_ago + 60))


def _recorded(admin) -> dict[str, tuple]:
    return {r["process_id"]: (r["beat_at"], r["stopped_at"])
            for r in admin.execute("SELECT process_id, beat_at, stopped_at FROM process_heartbeats")}


def test_only_processes_dead_for_longer_than_the_retention_are_pruned_and_the_live_and_recently_dead_stay(
        app_db, admin):
    stay = {
        "alive:1": dict(beat_ago=5),
        "alive-for-a-month:2": dict(beat_ago=5, started_ago=30 * DAY),
        "stopped-yesterday:3": dict(beat_ago=DAY, stopped_ago=DAY),
        "silent-since-yesterday:4": dict(beat_ago=DAY),
        # Its last beat is older than the retention, but it counted as alive for the silent limit after it:
        # dead for half an hour less than the retention.
        "silent-just-short-of-the-retention:5": dict(beat_ago=RETENTION + SILENT / 2),
        # Its beats stopped long ago (the database was unreachable, say) but its clean stop proves it lived on.
        "stopped-within-the-retention-after-old-beats:6": dict(beat_ago=RETENTION + DAY, stopped_ago=RETENTION - DAY),
    }
    go = {
        "stopped-long-ago:7": dict(beat_ago=RETENTION + DAY, stopped_ago=RETENTION + DAY),
        "stopped-just-past-the-retention:8": dict(beat_ago=RETENTION + SILENT / 2, stopped_ago=RETENTION + SILENT / 2),
        "silent-long-ago:9": dict(beat_ago=RETENTION + 3 * DAY),
        "silent-just-past-the-retention:10": dict(beat_ago=RETENTION + SILENT * 1.5),
    }
    for process_id, ages in {**stay, **go}.items():
        _seed(admin, process_id, **ages)
    before = _recorded(admin)

    counts = HeartbeatPruner(app_db, CONFIG).run_once()

    assert counts == PruneCounts(pruned=len(go), batches=1)
    # The rows that stay are untouched, not merely present.
    assert _recorded(admin) == {process_id: before[process_id] for process_id in stay}


def test_pruning_goes_batch_by_batch_until_a_batch_comes_back_short(app_db, admin):
    for n in range(5):
        _seed(admin, f"long-dead:{n}", beat_ago=RETENTION + DAY + n, stopped_ago=RETENTION + DAY + n)
    _seed(admin, "alive:99", beat_ago=1)

    counts = HeartbeatPruner(app_db, PruneConfig(retention_seconds=RETENTION, silent_seconds=SILENT,
                                                 batch_size=2)).run_once()

    assert counts == PruneCounts(pruned=5, batches=3)
    assert list(_recorded(admin)) == ["alive:99"]
    assert HeartbeatPruner(app_db, CONFIG).run_once() == PruneCounts(pruned=0, batches=1)


def test_a_long_silent_process_beating_while_pruning_runs_is_skipped_not_waited_for_and_stays_alive(
        connect_as, admin):
    _seed(admin, "back-from-the-dead:7", beat_ago=RETENTION + DAY, started_ago=RETENTION + DAY + 60)
    started_at = admin.execute("SELECT started_at FROM process_heartbeats").fetchone()["started_at"]
    me = ProcessIdentity("back-from-the-dead:7", "worker", "back-from-the-dead", 7, "1.0", started_at)
    beating, pruning = connect_as(Role.APP), connect_as(Role.APP)
    # A prune that waited for the beat's row lock would fail here instead of hanging the test.
    pruning.execute("SET lock_timeout = '5s'")

    with beating.transaction():
        assert heartbeat.beat(beating, me)   # holds the row's lock until the block ends
        assert heartbeat.prune(pruning, retention_seconds=RETENTION, silent_seconds=SILENT, batch_size=10) == 0

    assert heartbeat.prune(pruning, retention_seconds=RETENTION, silent_seconds=SILENT, batch_size=10) == 0
    [record] = heartbeat.processes(beating)
    assert record.identity == me and record.silent_seconds < SILENT


def test_a_process_whose_row_was_pruned_is_recorded_again_when_it_beats(conn, admin, app_db):
    _seed(admin, "host-a:4242", beat_ago=RETENTION + DAY)
    assert HeartbeatPruner(app_db, CONFIG).run_once().pruned == 1
    me = ProcessIdentity("host-a:4242", "worker", "host-a", 4242, "1.0", datetime.now(UTC))

    assert heartbeat.beat(conn, me)

    [record] = heartbeat.processes(conn)
    assert record.identity == me and record.stopped_at is None


def test_the_relays_role_may_beat_but_not_prune(connect_as, admin):
    _seed(admin, "relay-host:1", beat_ago=RETENTION + DAY)
    dispatcher = connect_as(Role.DISPATCHER)

    with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
        heartbeat.prune(dispatcher, retention_seconds=RETENTION, silent_seconds=SILENT, batch_size=10)

    assert list(_recorded(admin)) == ["relay-host:1"]
