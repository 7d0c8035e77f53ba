"""Workload 1: exports of 100 contacts completed per second through the running system, against the
same exports done with less, each measured in the same run, the order alternating between rounds.

- ours: the real ``exports relay``, two ``exports worker`` processes (2 threads each) and ``exports
  scheduler``, delivering to the partner; a closed-loop load generator keeps 16 exports outstanding
  (``export.create``), polling the ones it created by primary key.
- ceiling, the least work that delivers the same files (``bench.least_work``): 4 threads, each with a
  warm connection and a warm session, 3 transactions per export.
- ceiling, the protocol and nothing else (``bench.protocol_floor``): the product's statements and the
  delivery's observations on bare connections, a Redis list for the broker hop, 4 threads: what ours costs
  above it is the system's, not the protocol's.
- baselines, the same export body as a Procrastinate task and as a pgqueuer entrypoint
  (``bench.peer_exports``), 2 worker processes x 2, the same load generator deferring to them.

Each side runs alone: ours' processes are stopped while a ceiling runs (and started again, with a
warm-up, when ours runs next). Per export and per side: CPU by process kind, transactions, WAL syncs
and bytes, SSH logins, Redis commands (``bench.meter``); and the idle system's cost per second.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from app.actors.builder import ContactsBuilder
from app.actors.policy import Scope
from app.actors.stop import StopSignal
from app.store.database import connect
from app.store.types import Role
from bench import closed_loop, least_work, meter, peer_exports, protocol_floor, system
from bench.closed_loop import Generator, SideRun
from bench.export_body import Exporter, Target
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, log, settle, value_at_most
from bench.workloads.wakeup import TERMINAL, latencies

WORKERS = 2
THREADS = 2
#: Exports kept outstanding per worker thread by the load generator.
BACKLOG_PER_SLOT = 4
BACKLOG = WORKERS * THREADS * BACKLOG_PER_SLOT
TABLES = ("export_jobs", "export_attempt_events", "outbox")
OURS = "ours"


class SystemQueue:
    """Ours' load generator: ``export.create``, and the terminal ones among its ids."""

    def __init__(self, url: str, tenant: uuid.UUID, destination: uuid.UUID) -> None:
        self.tenant, self.destination = tenant, destination
        self.conn = connect(url, Role.APP)
        self.reader = psycopg.connect(url, autocommit=True)

    def submit(self) -> uuid.UUID:
        return system.create_export(self.conn, self.tenant, self.destination)

    def ended(self, ids: list) -> dict:
        return dict(self.reader.execute("SELECT id, status FROM export_jobs WHERE id = ANY(%s) AND status = ANY(%s)",
                                        (ids, list(TERMINAL))).fetchall())

    def close(self) -> None:
        self.conn.close()
        self.reader.close()


class SystemSide:
    """The running system; started on first use and kept up until ``down`` (a ceiling is about to run)."""

    name = OURS

    def __init__(self, url: str, broker_url: str, state: Path, tenant: uuid.UUID, destination: uuid.UUID) -> None:
        self.url, self.broker_url, self.state = url, broker_url, state
        self.tenant, self.destination = tenant, destination
        self.procs: system.Processes | None = None
        self.generator: Generator | None = None
        self.starts = 0
        #: The exports created inside measured windows, for workload 2's latencies under load.
        self.window_jobs: list[uuid.UUID] = []
        self.created = 0
        self._window_from = 0

    def start(self) -> None:
        if self.procs is None:
            system.flush_broker(self.broker_url)
            self.procs = system.Processes.for_database(self.url, self.broker_url, self.state / f"start-{self.starts}")
            self.procs.start_system(WORKERS, THREADS)
            self.starts += 1
        self.generator = Generator(SystemQueue(self.url, self.tenant, self.destination), BACKLOG).start()

    def down(self) -> None:
        if self.procs is not None:
            self.procs.stop()
            self.procs = None

    def mark(self) -> None:
        self._window_from = len(self.generator.created) if self.generator else 0

    def completed(self) -> int:
        return self.generator.completed if self.generator else 0

    def generator_transactions(self) -> int:
        return self.generator.polls if self.generator else 0

    def python_pids(self) -> list[int]:
        return self.procs.pids() if self.procs else []

    def check(self) -> None:
        if self.procs is not None:
            self.procs.check_alive()
        if self.generator is not None:
            self.generator.check()

    def stop(self) -> dict[str, int]:
        if self.generator is None:
            return {}
        generator, self.generator = self.generator, None
        statuses = generator.stop()
        self.window_jobs += generator.created[self._window_from:]
        self.created += len(generator.created)
        return statuses


def _table_stats(url: str) -> dict[str, dict[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) AS bytes"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s)", (list(TABLES),)).fetchall()
    return {r[0]: {"live": r[1], "dead": r[2], "bytes": r[3]} for r in rows}


def same_bytes_as_the_product(url: str, target: Target, work: Path) -> None:
    """The ceilings' body must write exactly the CSV the builder writes, or they deliver other files."""
    work.mkdir(parents=True, exist_ok=True)
    builder = ContactsBuilder(url, work)
    try:
        built = builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=uuid.UUID(target.tenant),
                              scope=Scope.CONSENTING_CONTACTS, stop=StopSignal())
    finally:
        builder.close()
    exporter = Exporter(target)
    try:
        mine = work / "ceiling.csv"
        exporter.build(mine)
        same = hashlib.sha256(mine.read_bytes()).digest() == built.sha256
    finally:
        exporter.close()
        built.delete()
    if not same:
        raise RuntimeError("the ceilings' COPY writes other bytes than the builder: fix bench.export_body")


def _ceilings(url: str, target: Target, outcome: Outcome, broker_url: str, destination: uuid.UUID) -> list[Any]:
    least_work.install(url)
    sides: list[Any] = [least_work.side(target), protocol_floor.side(target, broker_url, destination)]
    for kind, make in (("procrastinate", peer_exports.procrastinate_side), ("pgqueuer", peer_exports.pgqueuer_side)):
        try:
            peer_exports.install(kind, url)
        except ImportError as exc:
            outcome.notes.append(f"{kind} was not measured: not installed ({exc.name}); `pip install -e '.[bench]'`")
            continue
        sides.append(make(url, target, BACKLOG))
    return sides


def run_end_to_end(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome()
    state = ctx.work_dir / "e2e"
    with system.partner(state / "partner") as access:
        url = ctx.fresh_database("e2e")
        database = conninfo_to_dict(url)["dbname"]
        tenant, destination = system.add_tenant(url, access, sizes.e2e_contacts)
        ours = SystemSide(url, ctx.broker_url, state, tenant, destination)
        sides: list[Any] = []
        if access.openssh:
            assert access.key_file is not None
            target = Target(url, str(tenant), access.host, access.port, access.username, access.key_file,
                            access.host_key, access.remote_dir, str(state / "ceiling-work"))
            same_bytes_as_the_product(url, target, Path(target.work_dir))
            sides = _ceilings(url, target, outcome, ctx.broker_url, destination)
        else:
            outcome.notes.append("The ceilings were not measured: they deliver to OpenSSH sshd, which needs root.")
        sides.append(ours)
        servers = {"postgresql": system.postmaster_pid(url), "sshd": access.sshd_pid,
                   "redis": system.redis_pid(ctx.broker_url)}
        gauge = meter.Meter(ctx.base_url, str(database), {kind: [pid] for kind, pid in servers.items() if pid},
                            access.log, ctx.broker_url)
        runs: dict[str, list[SideRun]] = {side.name: [] for side in sides}
        idle: list[dict[str, float]] = []
        tables_before = _table_stats(url)
        try:
            # Round 0, not measured: each side fills its own tables, so the VACUUM ANALYZE before its first
            # measured round gives the planner their real statistics. Measured on empty tables, a side's
            # prepared statements keep the plans made for an empty table (sequential scans) while the table
            # grows, until autovacuum analyzes it a minute later: the first round then measured the planner's
            # cache, not the side (ours' first rounds ran at 0.67x its later ones, Procrastinate's at 0.71x).
            def alone(side: Any, seconds: float) -> SideRun:
                if side is not ours:
                    ours.down()
                settle(url)
                return closed_loop.measure(side, gauge, warmup=sizes.e2e_warmup_seconds, seconds=seconds)

            for side in sides:
                alone(side, sizes.e2e_warmup_seconds)
            for round_ in range(ctx.repeats):
                for side in (sides if round_ % 2 == 0 else sides[::-1]):
                    run = alone(side, sizes.e2e_seconds)
                    runs[side.name].append(run)
                    log(f"   {side.name}: {run.rate:.1f}/s, {run.costs.get('cpu_ms', float('nan')):.1f} ms CPU "
                        f"per export, statuses {run.statuses}")
                    if side is ours:
                        idle.append(closed_loop.idle(ours.python_pids(), gauge, sizes.e2e_idle_seconds))
        finally:
            ours.down()
            gauge.close()
        tables_after = _table_stats(url)
        ctx.shared["wakeup_under_load"] = latencies(url, ours.window_jobs)
    _rows(outcome, runs, idle, access, tables_before, tables_after, ours.created)
    _notes(outcome, runs, ctx, access, ours.starts)
    return outcome


def _median(runs: list[SideRun], key: str) -> float:
    values = [r.costs[key] for r in runs if key in r.costs and r.costs[key] == r.costs[key]]
    return statistics.median(values) if values else float("nan")


def _rows(outcome: Outcome, runs: dict[str, list[SideRun]], idle: list[dict[str, float]],
          access: system.PartnerAccess, before: dict, after: dict, created: int) -> None:
    ours = runs[OURS]
    rate = Stat.of([r.rate for r in ours])
    comparisons = [
        ("least work", "ceiling", "least work that delivers the same files, 4 threads", at_least(0.5)),
        ("protocol floor", "ceiling", "the protocol's statements and observations with nothing around them, "
         "4 threads", None),
        ("Procrastinate", "baseline", "the same export body as a Procrastinate task, 2x2", at_least(1.2)),
        ("pgqueuer", "baseline", "the same export body as a pgqueuer entrypoint, 2x2", None),
    ]
    for name, versus, what, goal in comparisons:
        if runs.get(name):
            outcome.rows.append(Row("exports of 100 contacts completed", "exports/s", rate,
                                    Stat.of([r.rate for r in runs[name]]), what, goal, versus=versus))
    if len(outcome.rows) == 0:
        outcome.rows.append(Row("exports of 100 contacts completed", "exports/s", rate))
    outcome.rows += [
        Row("drift, first vs last " + ("minute" if ours[0].seconds >= 180 else "third of the run"), "fraction",
            Stat.of([r.drift for r in ours]), goal=value_at_most(0.15, "<= 0.15")),
        Row("CPU per export, all kinds", "ms/export", Stat.of([r.costs.get("cpu_ms", float("nan")) for r in ours]),
            Stat.of([r.costs["cpu_ms"] for r in runs["least work"]]) if runs.get("least work") else None,
            "least work" if runs.get("least work") else "", versus="ceiling"),
        Row("machine busy during the run (all processes)", "fraction",
            Stat.of([r.costs.get("machine_busy", float("nan")) for r in ours])),
    ]
    if idle:
        for key, label, unit in (("redis_commands", "idle system: Redis commands", "commands/s"),
                                 ("cpu_python_ms", "idle system: CPU of its Python processes", "ms/s"),
                                 ("transactions", "idle system: transactions", "transactions/s"),
                                 ("wal_kib", "idle system: WAL the server wrote (any database)", "KiB/s")):
            values = [i[key] for i in idle if key in i]
            if values:
                outcome.rows.append(Row(label, unit, Stat.of(values)))
    for table in TABLES:
        grown = after.get(table, {}).get("bytes", 0) - before.get(table, {}).get("bytes", 0)
        outcome.rows.append(Row(f"{table}: growth over the {created} exports of ours' runs", "kB/1000 exports",
                                Stat.of([grown / 1024 / max(created, 1) * 1000])))
        outcome.rows.append(Row(f"{table}: dead tuples at the end", "tuples", Stat.of([after.get(table, {})
                                                                                        .get("dead", 0)])))
    names = [n for n in ("least work", "protocol floor", "Procrastinate", "pgqueuer", OURS) if runs.get(n)]
    lines = [("exports/s", lambda rs: statistics.median(r.rate for r in rs))]
    for key, label in COST_LINES:
        lines.append((label, lambda rs, key=key: _median(rs, key)))
    outcome.tables["Per export, by side (medians of the rounds)"] = with_before({
        "columns": ["per export", *names],
        "rows": [[label, *[fn(runs[n]) for n in names]] for label, fn in lines]})
    if access.sshd_pid is None:
        outcome.notes.append("sshd CPU and SSH logins were not measured: the partner is not an sshd of ours.")
    if not any("cpu_postgresql_ms" in r.costs for r in ours):
        outcome.notes.append("PostgreSQL CPU was not measured: the server does not run on this machine.")


#: Ours as issue 16 measured it at commit bad3b3b, before the changes it asked for (same workload, 2-core
#: machine, idle, 3 rounds), so the table shows before and after. A record, not a ceiling or a baseline:
#: it was not measured in this run. WAL is the issue's "KB"; Redis commands were not counted then.
BEFORE_LABEL = "ours before (issue 16, bad3b3b)"
BEFORE = {"exports/s": 56.5, "CPU, all kinds (ms)": 30.1, "CPU, Python of the side (ms)": 17.0,
          "CPU, PostgreSQL (ms)": 6.1, "CPU, sshd (ms)": 6.7, "CPU, redis-server (ms)": 0.5, "transactions": 30.5,
          "WAL fsyncs": 7.5, "WAL (KiB)": 10.6, "SSH logins per delivery": 0.205}


def with_before(table: dict[str, list]) -> dict[str, list]:
    """The per-side table with BEFORE as its last column (``-`` where nothing was measured then)."""
    return {"columns": [*table["columns"], BEFORE_LABEL],
            "rows": [[*row, BEFORE.get(row[0], "-")] for row in table["rows"]]}


COST_LINES = (
    ("cpu_ms", "CPU, all kinds (ms)"),
    ("cpu_python_ms", "CPU, Python of the side (ms)"),
    ("cpu_postgresql_ms", "CPU, PostgreSQL (ms)"),
    ("cpu_sshd_ms", "CPU, sshd (ms)"),
    ("cpu_redis_ms", "CPU, redis-server (ms)"),
    ("transactions", "transactions"),
    ("wal_syncs", "WAL fsyncs"),
    ("wal_kib", "WAL (KiB)"),
    ("ssh_logins", "SSH logins per delivery"),
    ("redis_commands", "Redis commands"),
)


def _notes(outcome: Outcome, runs: dict[str, list[SideRun]], ctx: Context, access: system.PartnerAccess,
           starts: int) -> None:
    sizes = ctx.sizes
    others = [r.costs.get("other_transactions_per_s", 0.0) for rs in runs.values() for r in rs]
    outcome.notes += [
        f"Partner: {access.kind} on loopback; ours: {WORKERS} `exports worker --processes 1 --threads {THREADS}`, "
        f"`exports relay`, `exports scheduler`, Redis {ctx.broker_url}, started {starts} times (stopped while "
        f"another side ran); the load generator keeps {BACKLOG} exports outstanding for ours and the peers. "
        f"Each side: its first completion, a {sizes.e2e_warmup_seconds:.0f} s warm-up, then a "
        f"{sizes.e2e_seconds:.0f} s window; a VACUUM ANALYZE and CHECKPOINT before each; an unmeasured round 0 "
        f"first, so no side is measured on tables its planner last saw empty.",
        "How the costs are counted: CPU from /proc/<pid>/stat, as the growth of each kind's process tree's "
        "utime+stime+cutime+cstime over the window (a process that exited and was reaped left its time in its "
        "parent's cutime/cstime, so per-connection processes that came and went are counted). Python: the side's "
        "own processes (ours: relay, workers, scheduler; least work: its process; peers: their worker "
        "processes), not the load generator, whose creations are counted in PostgreSQL, transactions and WAL; "
        "PostgreSQL: every process of the bench's server (backends, WAL writer, checkpointer, autovacuum); "
        "sshd: the partner's listener and its connections; Redis: the bench's redis-server. Transactions: "
        "pg_stat_database xact_commit+xact_rollback of the bench database, less the load generator's polls "
        "(counted by it). WAL: pg_stat_wal wal_sync and wal_bytes (server-wide). SSH logins: the partner "
        "sshd's 'Accepted publickey' log lines. Redis: INFO total_commands_processed.",
        "The ceiling and the baselines run bench.export_body per export: COPY into a local file, upload under a "
        "temporary name, no-overwrite rename, stat (no hash, no fsync, no listing), each worker thread with a warm "
        "connection and a warm session; its CSV is checked to be the builder's, byte for byte. Least work: one "
        "process, 4 threads, a job row inserted and marked done around each. Procrastinate: 2 worker processes, "
        "concurrency=2, a synchronous task; pgqueuer: 2 QueueManagers, max_concurrent_tasks=2 with batch_size=1 "
        "(it requires twice the batch), the body in asyncio.to_thread; both with LISTEN/NOTIFY and durable tables. "
        "pgqueuer's workers run on its asyncpg driver, as its documentation leads (its psycopg driver shares one "
        "connection between its NOTIFY reader and its queries, and paused up to a second between jobs: 9/s).",
        f"Server-wide figures (PostgreSQL CPU, WAL) include other databases' work: the other databases "
        f"committed {max(others, default=0.0):.1f} transactions/s at most during the windows, and a CREATE "
        "DATABASE elsewhere writes its template into the WAL in one transaction: on a shared server, read WAL "
        "per export against the idle system's WAL rate, and each run's costs below.",
    ]
    outcome.notes += _gap(runs, os.cpu_count() or 1)
    for name, side_runs in runs.items():
        outcome.notes.append(f"{name}: outcome of every export created: "
                             + ", ".join(f"run {i + 1}: {r.statuses}" for i, r in enumerate(side_runs)))
    outcome.details["Each run's costs per export (an outlier is a neighbour's work or a side's own spike)"] = "\n".join(
        f"{name:14s} run {i + 1}: {r.rate:7.1f}/s  " + "  ".join(
            f"{key} {r.costs.get(key, float('nan')):.2f}" for key in (
                "cpu_ms", "cpu_python_ms", "cpu_postgresql_ms", "transactions", "wal_syncs", "wal_kib",
                "other_transactions_per_s"))
        for name, rs in runs.items() for i, r in enumerate(rs))
    outcome.series["completed exports vs seconds"] = {
        f"{name} {i + 1}": [(t, c) for t, c in r.timeline] for name, rs in runs.items() for i, r in enumerate(rs)}


def _gap(runs: dict[str, list[SideRun]], cores: int) -> list[str]:
    """Where the gap to Procrastinate lies, from this run's medians: the system around the protocol (ours
    against the protocol floor) and the protocol's own statements (the floor against Procrastinate). And
    the budget the goal leaves: at 1.2x Procrastinate's rate, the machine's ``cores`` give every process
    together at most so much CPU per export, which the floor alone may already spend (its rate is not a
    CPU limit: with 4 threads it waits on round trips, so the budget is the firmer bound)."""
    names = (OURS, "protocol floor", "Procrastinate")
    if not all(runs.get(name) for name in names):
        return []
    ours, floor, peer = (statistics.median(r.rate for r in runs[name]) for name in names)
    py_ours, py_floor = _median(runs[OURS], "cpu_python_ms"), _median(runs["protocol floor"], "cpu_python_ms")
    pg_floor, pg_peer = (_median(runs[n], "cpu_postgresql_ms") for n in ("protocol floor", "Procrastinate"))
    tx_floor, tx_peer = (_median(runs[n], "transactions") for n in ("protocol floor", "Procrastinate"))
    line = (f"Where the gap to Procrastinate lies: ours runs at {ours / floor:.2f}x the protocol floor (the system "
            f"around the protocol: Python {py_ours:.2f} ms per export against the floor's {py_floor:.2f}), and the "
            f"floor itself at {floor / peer:.2f}x Procrastinate (the protocol's statements: PostgreSQL "
            f"{pg_floor:.2f} ms per export against Procrastinate's {pg_peer:.2f}, {tx_floor:.1f} transactions "
            f"against {tx_peer:.1f}).")
    if 1.2 * peer > floor:
        line += (f" Ours at 1.2x Procrastinate would need {1.2 * peer / floor:.2f}x the floor: more than the "
                 "protocol with nothing around it, so no cut in the system alone reaches it.")
    budget, cpu_floor = cores * 1000 / (1.2 * peer), _median(runs["protocol floor"], "cpu_ms")
    line += (f" At 1.2x Procrastinate ({1.2 * peer:.0f}/s), this machine's {cores} cores leave every process "
             f"together at most {budget:.2f} ms of CPU per export; the floor alone spends {cpu_floor:.2f}"
             + (", more than all of it." if cpu_floor > budget else
                f", leaving {budget - cpu_floor:.2f} for the system around the protocol, the load and the kernel."))
    return [line]


END_TO_END = Workload(
    "1", "End to end", "Exports of 100 contacts completed per second through the real relay, two worker processes "
    "(2 threads each) and the scheduler, delivering to a local SFTP partner, with a closed-loop load generator. "
    "Ceiling: the least work that delivers the same files (4 threads, warm sessions, 3 transactions per "
    "export). Baselines: the same export body as a Procrastinate task and as a pgqueuer entrypoint, 2 processes "
    "x 2. Each side alone, in the same run, alternating; per export: CPU by process kind, transactions, WAL, "
    "SSH logins and Redis commands; drift, dead tuples and table growth.", run_end_to_end)

