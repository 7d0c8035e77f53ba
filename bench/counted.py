"""Counted costs: what one export and an idle second cost in things that load does not change.

    python -m bench.counted [--exports N] [--burst N] [--idle-seconds S]

Starts the system as ``bench/workloads/end_to_end.py`` does (``exports relay``, two ``exports worker
--processes 1 --threads 2``, ``exports scheduler``, JSON logs at INFO) on a scratch database, a private
redis-server and the partner, then counts:

- idle: Redis commands per second, by command (``INFO commandstats``);
- one at a time: N exports, each created only once the last one ended (the quiet-hours cost);
- a burst: N exports created at once, counted until every one ended (the busy-hours cost);

and for each, per export: the system's PostgreSQL transactions (``pg_stat_database`` of the scratch
database, read from another one, less the creations and the bench's own polls, which it counts, and
the idle rate over the window), its Redis commands by command (less the idle rate), and its INFO log
lines by event. Timing does not enter these figures except through the idle rate, which is why they
hold on a loaded machine.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
from psycopg.conninfo import conninfo_to_dict

from app.store.database import connect
from app.store.types import Role
from bench import _scratch, system
from bench.workloads.wakeup import TERMINAL

#: How often the bench polls for the end of its exports, in seconds; each poll is one transaction it subtracts.
POLL_SECONDS = 0.05
#: Longest wait for the exports of one measurement to end, in seconds.
END_TIMEOUT = 300.0
#: PostgreSQL (15 and later) adds a backend's transactions to pg_stat_database at most once a second
#: while it is busy, and within 10 s once it is idle: each reading waits this long after the work it
#: counts (the idle rate over the wait is subtracted with the rest).
STATS_FLUSH_SECONDS = 11.0


@dataclass
class Snapshot:
    at: float
    transactions: int
    commands: collections.Counter[str]
    log_lines: dict[str, int]


class Counter:
    """Reads the counters of one scratch database, one Redis and one log directory."""

    def __init__(self, admin_url: str, database: str, broker_url: str, log_dir: Path) -> None:
        self.admin = psycopg.connect(admin_url, autocommit=True)
        self.database = database
        self.redis = redis.Redis.from_url(broker_url)
        self.log_dir = log_dir

    def snapshot(self) -> Snapshot:
        (transactions,) = self.admin.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (self.database,)
        ).fetchone() or (0,)
        stats = self.redis.info("commandstats")
        # The reading itself (INFO) is left out: it is the bench's, not the system's.
        commands = collections.Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
                                        if name != "cmdstat_info"})
        return Snapshot(time.monotonic(), int(transactions), commands, self.line_counts())

    def lines(self, since: dict[str, int] | None = None) -> dict[str, list[str]]:
        """Each process's JSON lines, by log file; from line ``since[file]`` on."""
        since = since or {}
        return {path.name: [line for line in path.read_text(errors="replace").splitlines()
                            if line.startswith("{")][since.get(path.name, 0):]
                for path in sorted(self.log_dir.glob("*.log"))}

    def line_counts(self) -> dict[str, int]:
        return {name: len(lines) for name, lines in self.lines().items()}

    def close(self) -> None:
        self.admin.close()
        self.redis.close()


def _per_second(before: Snapshot, after: Snapshot) -> tuple[float, dict[str, float]]:
    seconds = after.at - before.at
    commands = after.commands - before.commands
    return (after.transactions - before.transactions) / seconds, {k: v / seconds for k, v in commands.items()}


def _events(lines: list[str], job_ids: set[str]) -> collections.Counter[str]:
    """INFO lines about these jobs by event (a batch line counts for each of its jobs it names)."""
    events: collections.Counter[str] = collections.Counter()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("job_id") in job_ids or job_ids & set(record.get("job_ids") or ()):
            events[record.get("event", "?")] += 1
    return events


class Creator:
    def __init__(self, url: str, tenant: uuid.UUID, destination: uuid.UUID) -> None:
        self.tenant, self.destination = tenant, destination
        self.conn = connect(url, Role.APP)
        self.reader = psycopg.connect(url, autocommit=True)
        #: Transactions the bench ran on the scratch database: creations, polls (and their SET ROLE).
        self.transactions = 0

    def create(self) -> str:
        job_id = system.create_export(self.conn, self.tenant, self.destination)
        self.transactions += 1
        return str(job_id)

    def wait_ended(self, ids: list[str]) -> dict[str, str]:
        deadline = time.monotonic() + END_TIMEOUT
        while True:
            rows = self.reader.execute("SELECT id::text, status FROM export_jobs WHERE id = ANY(%s::uuid[]) "
                                       "AND status = ANY(%s)", (ids, list(TERMINAL))).fetchall()
            self.transactions += 1
            if len(rows) == len(ids):
                return dict(rows)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ids) - len(rows)} of {len(ids)} exports did not end in {END_TIMEOUT} s")
            time.sleep(POLL_SECONDS)   # polling a condition with a deadline

    def close(self) -> None:
        self.conn.close()
        self.reader.close()


def measure(counter: Counter, creator: Creator, idle: tuple[float, dict[str, float]], *, exports: int,
            burst: bool) -> dict[str, object]:
    idle_tx, idle_commands = idle
    before, tx0 = counter.snapshot(), creator.transactions
    ids: list[str] = []
    statuses: collections.Counter[str] = collections.Counter()
    if burst:
        ids = [creator.create() for _ in range(exports)]
        statuses.update(creator.wait_ended(ids).values())
    else:
        for _ in range(exports):
            ids.append(creator.create())
            statuses.update(creator.wait_ended(ids[-1:]).values())
    time.sleep(STATS_FLUSH_SECONDS)   # until every transaction of the exports is in the counters
    after = counter.snapshot()
    seconds = after.at - before.at
    ours = creator.transactions - tx0
    transactions = (after.transactions - before.transactions - ours - idle_tx * seconds) / exports
    delta = after.commands - before.commands
    commands = {k: (v - idle_commands.get(k, 0.0) * seconds) / exports for k, v in delta.items()}
    events = _events([line for lines in counter.lines(before.log_lines).values() for line in lines], set(ids))
    return {
        "exports": exports, "seconds": round(seconds - STATS_FLUSH_SECONDS, 2), "statuses": dict(statuses),
        "transactions_per_export": round(transactions, 2),
        "transactions_per_export_idle_included": round((after.transactions - before.transactions - ours) / exports, 2),
        "redis_commands_per_export": round(sum(commands.values()), 2),
        "redis_commands_per_export_idle_included": round(sum(delta.values()) / exports, 2),
        "redis_by_command": {k: round(v, 2) for k, v in sorted(commands.items()) if abs(v) >= 0.005},
        "log_lines_per_export": round(sum(events.values()) / exports, 2),
        "log_events_per_export": {k: round(v / exports, 2) for k, v in sorted(events.items())},
    }


@contextlib.contextmanager
def running_system(work: Path, broker_url: str) -> Iterator[tuple[Counter, Creator, system.Processes]]:
    base = _scratch.base_url()
    name = f"exports_bench_counted_{uuid.uuid4().hex[:6]}"
    url = _scratch.create(base, name)
    try:
        with system.partner(work / "partner") as access:
            tenant, destination = system.add_tenant(url, access, 100)
            procs = system.Processes.for_database(url, broker_url, work / "state", EXPORTS_LOG_FORMAT="json",
                                                  PYTHONUNBUFFERED="1")   # every line in the file when counted
            procs.start_system(2, 2)
            counter = Counter(base, conninfo_to_dict(url)["dbname"], broker_url, procs.log_dir)
            creator = Creator(url, tenant, destination)
            try:
                yield counter, creator, procs
            finally:
                creator.close()
                counter.close()
                procs.stop()
    finally:
        _scratch.drop(base, name)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.counted", description=__doc__.splitlines()[0])
    parser.add_argument("--exports", type=int, default=100, help="exports created one at a time (default 100)")
    parser.add_argument("--burst", type=int, default=200, help="exports created at once (default 200)")
    parser.add_argument("--idle-seconds", type=float, default=30.0,
                        help="the idle window (default 30: three rounds of the slowest periodic service)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exports-counted-") as tmp:
        work = Path(tmp)
        with system.private_redis(work / "redis") as broker_url, \
                running_system(work, broker_url) as (counter, creator, procs):
            creator.wait_ended([creator.create()])   # every process up, sessions warm
            procs.check_alive()
            time.sleep(STATS_FLUSH_SECONDS)   # the set-up's transactions in the counters before the idle window
            before = counter.snapshot()
            time.sleep(args.idle_seconds)   # the idle window
            idle = _per_second(before, counter.snapshot())
            result = {
                "idle": {"transactions_per_s": round(idle[0], 2),
                         "redis_commands_per_s": round(sum(idle[1].values()), 1),
                         "redis_by_command_per_s": {k: round(v, 1) for k, v in sorted(idle[1].items()) if v}},
                "one_at_a_time": measure(counter, creator, idle, exports=args.exports, burst=False),
                "burst": measure(counter, creator, idle, exports=args.burst, burst=True),
            }
            procs.check_alive()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
