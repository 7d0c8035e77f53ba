"""What a measuring window cost, read before and after it: CPU by process kind, transactions, WAL,
SSH logins and Redis commands, and their cost per export.

- CPU: the counter of each kind's process trees (``bench.procstat``), the kind's roots named by the
  caller: the Python processes of the side under test, the postmaster of the bench's PostgreSQL (every
  backend and background process of that server), the partner's sshd (every connection's process) and
  the bench's redis-server.
- Transactions: ``xact_commit + xact_rollback`` of the bench database in ``pg_stat_database``, read
  from another database so the reading is not counted; the other databases' count is kept too, since
  WAL and the server's CPU are the whole server's (a busy neighbour shows there).
- WAL: ``wal_sync`` and ``wal_bytes`` of ``pg_stat_wal`` (PostgreSQL 14 and later), server-wide.
- SSH logins: "Accepted publickey" lines in the partner sshd's log.
- Redis: ``total_commands_processed`` of INFO stats, less the INFO commands of the readings.

PostgreSQL's counters are flushed by each backend at most once a second, so each end of a window may
lag by up to a second's worth; in a steady closed loop the two lags cancel.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis

from bench import procstat

#: The kinds of process CPU is reported by, in the order of the report.
KINDS = ("python", "postgresql", "sshd", "redis")

_DATABASE_STATS = """
SELECT coalesce(sum(xact_commit + xact_rollback) FILTER (WHERE datname = %(db)s), 0)::bigint,
       coalesce(sum(xact_commit + xact_rollback) FILTER (WHERE datname <> %(db)s), 0)::bigint,
       (SELECT wal_sync FROM pg_stat_wal), (SELECT wal_bytes FROM pg_stat_wal)::bigint
FROM pg_stat_database
"""


@dataclass(frozen=True)
class Reading:
    at: float
    #: CPU seconds by kind; a kind with no process to read is missing.
    cpu: Mapping[str, float]
    transactions: int
    other_transactions: int
    wal_syncs: int
    wal_bytes: int
    ssh_logins: int | None
    redis_commands: int | None
    machine: tuple[int, int]


def count_logins(log_text: str) -> int:
    return sum(1 for line in log_text.splitlines() if "Accepted publickey" in line or "Accepted password" in line)


@dataclass
class Meter:
    """Reads the counters of one database's server, one partner and one Redis. ``roots`` are the root
    pids of the kinds that stay for the whole workload (the postmaster, sshd, redis-server); each
    reading adds the side's own (its Python processes)."""

    admin_url: str
    database: str
    roots: Mapping[str, list[int]]
    sshd_log: Path | None = None
    redis_url: str | None = None
    _redis: redis.Redis | None = field(default=None, repr=False)
    _conn: psycopg.Connection | None = field(default=None, repr=False)

    def read(self, roots: Mapping[str, list[int]]) -> Reading:
        if self._conn is None:
            self._conn = psycopg.connect(self.admin_url, autocommit=True)
        stats = procstat.read_all()
        ticks = procstat.ticks_per_second()
        cpu = {kind: procstat.tree_ticks(stats, pids) / ticks for kind, pids in {**self.roots, **roots}.items()
               if any(pid in stats for pid in pids)}
        row = self._conn.execute(_DATABASE_STATS, {"db": self.database}).fetchone()
        assert row is not None
        logins = None
        if self.sshd_log is not None:
            try:
                logins = count_logins(self.sshd_log.read_text(errors="replace"))
            except OSError:
                logins = None
        commands = None
        if self.redis_url is not None:
            if self._redis is None:
                self._redis = redis.Redis.from_url(self.redis_url)
            commands = int(self._redis.info("stats")["total_commands_processed"])
        return Reading(time.monotonic(), cpu, int(row[0]), int(row[1]), int(row[2] or 0), int(row[3] or 0), logins,
                       commands, procstat.machine_jiffies())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None


def per_export(before: Reading, after: Reading, exports: int, *, generator_transactions: int = 0) -> dict[str, float]:
    """What the window cost per export. ``generator_transactions`` are the load generator's own reads
    (its polls for finished exports), which are not the side's work and are taken off; its creations
    are the side's work and stay. CPU is in milliseconds, WAL in KiB."""
    nan = float("nan")
    if exports <= 0:
        return {}
    costs: dict[str, float] = {}
    for kind in KINDS:
        if kind in before.cpu and kind in after.cpu:
            costs[f"cpu_{kind}_ms"] = 1000 * (after.cpu[kind] - before.cpu[kind]) / exports
    costs["cpu_ms"] = sum(costs.get(f"cpu_{kind}_ms", 0.0) for kind in KINDS)
    costs["transactions"] = (after.transactions - before.transactions - generator_transactions) / exports
    costs["wal_syncs"] = (after.wal_syncs - before.wal_syncs) / exports
    costs["wal_kib"] = (after.wal_bytes - before.wal_bytes) / 1024 / exports
    costs["ssh_logins"] = ((after.ssh_logins - before.ssh_logins) / exports
                           if after.ssh_logins is not None and before.ssh_logins is not None else nan)
    # The later reading's INFO is not counted yet when it answers; the earlier one's is.
    costs["redis_commands"] = ((after.redis_commands - before.redis_commands - 1) / exports
                               if after.redis_commands is not None and before.redis_commands is not None else nan)
    busy = [a - b for a, b in zip(after.machine, before.machine, strict=True)]
    costs["machine_busy"] = busy[0] / busy[1] if busy[1] else nan
    # The meter's own reading runs in another database: one transaction per reading there.
    costs["other_transactions_per_s"] = ((after.other_transactions - before.other_transactions - 1)
                                         / max(after.at - before.at, 1e-9))
    return costs


def per_second(before: Reading, after: Reading) -> dict[str, float]:
    """The same counters per second of the window, for a run with no load."""
    seconds = max(after.at - before.at, 1e-9)
    rates = {f"cpu_{kind}_ms": 1000 * (after.cpu[kind] - before.cpu[kind]) / seconds
             for kind in KINDS if kind in before.cpu and kind in after.cpu}
    rates["transactions"] = (after.transactions - before.transactions) / seconds
    rates["wal_syncs"] = (after.wal_syncs - before.wal_syncs) / seconds
    rates["wal_kib"] = (after.wal_bytes - before.wal_bytes) / 1024 / seconds
    rates["other_transactions"] = (after.other_transactions - before.other_transactions - 1) / seconds
    if after.redis_commands is not None and before.redis_commands is not None:
        rates["redis_commands"] = (after.redis_commands - before.redis_commands - 1) / seconds
    return rates
