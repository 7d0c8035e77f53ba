"""Workloads 1 and 2: the running system end to end, and how soon a created export starts.

1. Exports of 100 contacts completed per second through the real ``exports relay``, two ``exports
   worker`` processes (2 threads each) and ``exports scheduler``, delivering to a local SFTP partner,
   with a closed-loop creator keeping 4 exports per worker thread outstanding. Ceiling: the slowest
   stage measured alone at the same concurrency (2 processes x 2 threads): the builder, or the
   delivery of the same file to the same partner.
2. Wake-up latency, from the creation's commit (its outbox row's ``created_at``) to the Claimed event
   and to the Finished (Completed) event, all on the database's clock: under the end-to-end load (from
   workload 1's exports) and idle (one export at a time, 1-2.5 s apart), as shipped and with the
   Dramatiq consumer's idle poll shortened (``dramatiq_worker_timeout``, an environment variable
   Dramatiq reads; no product change). Ceiling: the bare path, a NOTIFY round trip that pushes to a
   Redis list another client pops.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import psycopg
import redis

from app.actors.builder import ContactsBuilder
from app.actors.policy import Scope
from app.actors.stop import StopSignal
from app.delivery.destination import Destination, DestinationConfig
from app.store import directory, export
from app.store.database import connect
from app.store.types import ExpectedFile, Role
from bench import system
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, log, percentile, settle, value_at_most

WORKERS = 2
THREADS = 2
#: Exports kept outstanding per worker thread by the creator.
BACKLOG_PER_SLOT = 4
#: The shortened idle poll for the tuned variant, in milliseconds.
TUNED_WORKER_TIMEOUT_MS = 50
TERMINAL = ("Completed", "Failed", "OutcomeUnknown", "Stopped", "Canceled", "Rejected")
TABLES = ("export_jobs", "export_attempt_events", "outbox")


# --- the ceiling: one stage alone, in 2 processes x 2 threads ----------------------------------------


def _stage_process(kind: str, url: str, tenant: str, destination: str, seconds: float, threads: int,
                   work_dir: str) -> int:
    """Runs in a fresh process: ``threads`` threads doing ``kind`` (build or upload) for ``seconds``."""
    tenant_id, destination_id = uuid.UUID(tenant), uuid.UUID(destination)
    builder = ContactsBuilder(url, Path(work_dir))
    with contextlib.closing(connect(url, Role.APP)) as conn:
        config = DestinationConfig.from_row(directory.read_destination(conn, tenant_id=tenant_id,
                                                                       destination_id=destination_id))
    sample = builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant_id,
                           scope=Scope.CONSENTING_CONTACTS, stop=StopSignal())
    counts = [0] * threads
    deadline = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < deadline:
            if kind == "build":
                builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant_id,
                              scope=Scope.CONSENTING_CONTACTS, stop=StopSignal()).delete()
            else:
                expected = ExpectedFile(f"stage-{uuid.uuid4().hex}.csv", sample.size, sample.sha256)
                outcome = Destination(config).deliver(sample.path, expected, attempt_id=str(uuid.uuid4()),
                                                      record_evidence=lambda evidence: None)
                if outcome.status != "Completed":
                    raise RuntimeError(f"stage upload ended {outcome.status}")
            counts[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    sample.delete()
    return sum(counts)


def stage_rate(kind: str, url: str, tenant: uuid.UUID, destination: uuid.UUID, seconds: float,
               work_dir: Path) -> float:
    with ProcessPoolExecutor(WORKERS, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_stage_process, kind, url, str(tenant), str(destination), seconds, THREADS,
                               str(work_dir)) for _ in range(WORKERS)]
        # Spawning takes a moment: the window is each process's own, measured inside it.
        return sum(f.result() for f in futures) / seconds


# --- the system's run --------------------------------------------------------------------------------


def _counts(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM export_jobs WHERE status = ANY(%s)", (list(TERMINAL),)).fetchone()[0]


def _table_stats(url: str) -> dict[str, dict[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        rows = conn.execute(
            "SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid) AS bytes"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s)", (list(TABLES),)).fetchall()
    return {r[0]: {"live": r[1], "dead": r[2], "bytes": r[3]} for r in rows}


def _busy_jiffies() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Creator:
    """Keeps ``backlog`` exports outstanding (created, not yet terminal) until stopped."""

    def __init__(self, url: str, tenant: uuid.UUID, destination: uuid.UUID, backlog: int) -> None:
        self.url, self.tenant, self.destination, self.backlog = url, tenant, destination, backlog
        self.created: list[uuid.UUID] = []
        self.done = 0
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with contextlib.closing(connect(self.url, Role.APP)) as conn, \
                    psycopg.connect(self.url, autocommit=True) as reader:
                # Ended before this run: not this run's to count.
                baseline = _counts(reader)
                while not self.stop.is_set():
                    if len(self.created) - self.done < self.backlog:
                        job_id = uuid.uuid4()
                        result = export.create(conn, job_id=job_id, tenant_id=self.tenant,
                                               destination_id=self.destination, delivery_key=job_id.hex,
                                               created_by="bench")
                        assert result is export.CreateResult.CREATED, result
                        self.created.append(job_id)
                    else:
                        self.done = _counts(reader) - baseline
                        self.stop.wait(0.01)
        except BaseException as exc:   # surfaced by the caller
            self.failure = exc


def system_run(url: str, procs: system.Processes, tenant: uuid.UUID, destination: uuid.UUID,
               seconds: float, backlog: int) -> dict:
    """One window of the closed loop; returns the rate, its timeline and what the tables did."""
    before = _table_stats(url)
    cpu_before = system.process_tree_cpu(procs.pids())
    busy_before = _busy_jiffies()
    creator = Creator(url, tenant, destination, backlog)
    thread = threading.Thread(target=creator.run, daemon=True)
    timeline: list[tuple[float, int]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        start_count = _counts(conn)
        thread.start()
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            timeline.append((elapsed, _counts(conn) - start_count))
            procs.check_alive()
            if creator.failure:
                raise creator.failure
            time.sleep(0.5)   # a sampling interval, not a wait for a condition
        completed = _counts(conn) - start_count
        timeline.append((time.monotonic() - started, completed))
        creator.stop.set()
        thread.join()
        cpu = system.process_tree_cpu(procs.pids()) - cpu_before
        busy = [a - b for a, b in zip(_busy_jiffies(), busy_before, strict=True)]
        # Let the backlog finish so the next run starts with none.
        deadline = time.monotonic() + 120
        while _counts(conn) - start_count < len(creator.created) and time.monotonic() < deadline:
            time.sleep(0.2)
        statuses = dict(conn.execute(
            "SELECT status, count(*) FROM export_jobs WHERE id = ANY(%s) GROUP BY status",
            (creator.created,)).fetchall())
    after = _table_stats(url)
    third = seconds / 3 if seconds < 180 else 60.0

    # The first window starts at the first completion: the loop's own start-up is not drift.
    t0 = next((t for t, c in timeline if c > 0), 0.0)

    def rate_between(a: float, b: float) -> float:
        inside = [(t, c) for t, c in timeline if a <= t <= b]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0

    first, last = rate_between(t0, t0 + third), rate_between(seconds - third, seconds)
    return {
        "rate": completed / seconds, "completed": completed, "created": len(creator.created),
        "drift": abs(last - first) / first if first else float("nan"), "first": first, "last": last,
        "timeline": timeline, "statuses": statuses, "jobs": creator.created,
        "cpu_ms_per_export": 1000 * cpu / completed if completed else float("nan"),
        "machine_busy": busy[0] / busy[1] if busy[1] else float("nan"),
        "before": before, "after": after,
    }


def latencies(url: str, jobs: list[uuid.UUID]) -> tuple[list[float], list[float]]:
    """Seconds from each job's first outbox row to its Claimed and its Finished event."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            WITH created AS (SELECT job_id, min(created_at) AS at FROM outbox
                             WHERE job_id = ANY(%(ids)s) GROUP BY job_id)
            SELECT extract(epoch FROM c.recorded_at - created.at) AS claimed,
                   extract(epoch FROM f.recorded_at - created.at) AS finished
            FROM created
            LEFT JOIN export_attempt_events c ON c.job_id = created.job_id AND c.kind = 'Claimed'
            LEFT JOIN export_attempt_events f ON f.job_id = created.job_id AND f.kind = 'Finished'
            """, {"ids": jobs}).fetchall()
    return [float(r[0]) for r in rows if r[0] is not None], [float(r[1]) for r in rows if r[1] is not None]


# --- the wake-up ceiling -----------------------------------------------------------------------------


def bare_wakeups(url: str, broker_url: str, samples: int) -> list[float]:
    """Commit a NOTIFY; a listener pushes to a Redis list; another client pops it. Seconds, each."""
    key = f"bench:wakeup:{uuid.uuid4().hex}"
    results: list[float] = []
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as sender:
        listener.execute("LISTEN bench_wakeup")
        pusher, popper = redis.Redis.from_url(broker_url), redis.Redis.from_url(broker_url)

        def relay() -> None:
            for _ in range(samples):
                for _ in listener.notifies(timeout=5, stop_after=1):
                    pusher.lpush(key, b"x")

        thread = threading.Thread(target=relay)
        thread.start()
        for _ in range(samples):
            started = time.perf_counter()
            sender.execute("SELECT pg_notify('bench_wakeup', '')")
            popper.brpop([key], timeout=5)
            results.append(time.perf_counter() - started)
        thread.join()
        pusher.close()
        popper.close()
    return results


def idle_wakeups(url: str, tenant: uuid.UUID, destination: uuid.UUID, samples: int, seed: int) -> list[uuid.UUID]:
    """One export at a time, each after a 1-2.5 s pause (so the consumers are at their idle backoff),
    each waited for until terminal."""
    rng = random.Random(seed)
    jobs = []
    with contextlib.closing(connect(url, Role.APP)) as conn:
        for _ in range(samples):
            time.sleep(rng.uniform(1.0, 2.5))   # the arrival pattern under test: sparse creations
            job_id = uuid.uuid4()
            export.create(conn, job_id=job_id, tenant_id=tenant, destination_id=destination,
                          delivery_key=job_id.hex, created_by="bench")
            jobs.append(job_id)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status = conn.execute("SELECT status FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
                if status["status"] in TERMINAL:
                    break
                time.sleep(0.02)
    return jobs


# --- the workloads -----------------------------------------------------------------------------------


def _ms(values: list[float]) -> list[float]:
    return [v * 1000 for v in values]


def run_end_to_end(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome()
    state = ctx.work_dir / "e2e"
    with system.partner(state / "partner") as access:
        url = ctx.fresh_database("e2e")
        tenant, destination = system.add_tenant(url, access, sizes.e2e_contacts)
        system.flush_broker(ctx.broker_url)
        procs = system.Processes.for_database(url, ctx.broker_url, state)
        procs.start_system(WORKERS, THREADS)
        try:
            log("   warm-up")
            system_run(url, procs, tenant, destination, 5, WORKERS * THREADS * BACKLOG_PER_SLOT)
            stage_seconds = max(4.0, sizes.e2e_seconds / 5)
            runs: list[dict] = []
            ceilings: list[float] = []
            stages: dict[str, list[float]] = {"build": [], "upload": []}

            def ceiling() -> float:
                for kind in ("build", "upload"):
                    stages[kind].append(stage_rate(kind, url, tenant, destination, stage_seconds, state / "stage"))
                return min(stages["build"][-1], stages["upload"][-1])

            def ours() -> float:
                runs.append(system_run(url, procs, tenant, destination, sizes.e2e_seconds,
                                       WORKERS * THREADS * BACKLOG_PER_SLOT))
                log(f"   system {runs[-1]['rate']:.1f}/s, statuses {runs[-1]['statuses']}")
                return runs[-1]["rate"]

            ceilings, ourselves = ctx.paired(ceiling, ours, prepare=lambda: settle(url))
            claimed, finished = [], []
            for run in runs:
                c, f = latencies(url, run["jobs"])
                claimed += c
                finished += f
            ctx.shared["wakeup_under_load"] = (claimed, finished)
        finally:
            procs.stop()
    slowest = "build" if statistics_median(stages["build"]) < statistics_median(stages["upload"]) else "upload"
    outcome.rows += [
        Row(f"exports of {sizes.e2e_contacts} contacts completed", "exports/s", Stat.of(ourselves),
            Stat.of(ceilings), f"slowest stage alone ({slowest}), {WORKERS}x{THREADS}", at_least(0.3)),
        Row("drift, first vs last " + ("minute" if sizes.e2e_seconds >= 180 else "third of the run"), "fraction",
            Stat.of([r["drift"] for r in runs]), goal=value_at_most(0.15, "<= 0.15")),
        Row("builds alone (stage ceiling)", "builds/s", Stat.of(stages["build"])),
        Row(f"uploads alone to {access.kind} (stage ceiling)", "uploads/s", Stat.of(stages["upload"])),
        Row("CPU of relay, workers and scheduler", "ms/export", Stat.of([r["cpu_ms_per_export"] for r in runs])),
        Row("machine busy during the run (all processes)", "fraction", Stat.of([r["machine_busy"] for r in runs])),
    ]
    completed = sum(r["completed"] for r in runs)
    for table in TABLES:
        grown = runs[-1]["after"].get(table, {}).get("bytes", 0) - runs[0]["before"].get(table, {}).get("bytes", 0)
        outcome.rows.append(Row(f"{table}: growth over {completed} exports", "kB/1000 exports",
                                Stat.of([grown / 1024 / max(completed, 1) * 1000])))
        outcome.rows.append(Row(f"{table}: dead tuples at the end of a run", "tuples",
                                Stat.of([r["after"].get(table, {}).get("dead", 0) for r in runs])))
    outcome.notes += [
        f"Partner: {access.kind} on loopback; {WORKERS} `exports worker --processes 1 --threads {THREADS}`, "
        f"`exports relay`, `exports scheduler`; Redis {ctx.broker_url}; the creator keeps "
        f"{WORKERS * THREADS * BACKLOG_PER_SLOT} exports outstanding; {sizes.e2e_seconds:.0f} s per run.",
        "Outcome of every export created: " + ", ".join(f"run {i + 1}: {r['statuses']}" for i, r in enumerate(runs)),
        f"Stage ceilings: {stage_seconds:.0f} s each, in {WORKERS} fresh processes x {THREADS} threads, "
        "the builder opening its connection per build as the product does.",
    ]
    outcome.series["completed exports vs seconds"] = {
        f"run {i + 1}": [(t, c) for t, c in r["timeline"]] for i, r in enumerate(runs)}
    return outcome


def statistics_median(values: list[float]) -> float:
    return Stat.of(values).median if values else float("nan")


def run_wakeup(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    outcome = Outcome()
    state = ctx.work_dir / "wakeup"
    variants: dict[str, tuple[list[float], list[float]]] = {}
    with system.partner(state / "partner") as access:
        url = ctx.fresh_database("wakeup")
        tenant, destination = system.add_tenant(url, access, sizes.e2e_contacts)
        ceiling = bare_wakeups(url, ctx.broker_url, max(50, sizes.wakeup_idle_samples * 5))
        for name, env in (("as shipped", {}), (f"dramatiq_worker_timeout={TUNED_WORKER_TIMEOUT_MS}",
                                              {"dramatiq_worker_timeout": str(TUNED_WORKER_TIMEOUT_MS)})):
            system.flush_broker(ctx.broker_url)
            procs = system.Processes.for_database(url, ctx.broker_url, state / slug_of(name))
            procs.start_system(WORKERS, THREADS, **env)
            try:
                idle_wakeups(url, tenant, destination, 2, seed=1)   # warm-up: the workers' first export
                jobs = idle_wakeups(url, tenant, destination, sizes.wakeup_idle_samples, seed=7)
                variants[name] = latencies(url, jobs)
                redis_idle = _redis_commands_per_second(ctx.broker_url, 3.0)
                outcome.notes.append(f"{name}: the Redis server answered {redis_idle:.0f} commands/s with the "
                                     "system idle (server-wide: other clients of this Redis count too).")
            finally:
                procs.stop()
    ceiling_stat = Stat.of(_ms(ceiling))
    p99 = Stat.of([percentile(_ms(ceiling), 99)])
    for name, (claimed, finished) in variants.items():
        outcome.rows += [
            Row(f"idle, {name}: commit -> Claimed p50", "ms", Stat.of([percentile(_ms(claimed), 50)]),
                Stat.of([ceiling_stat.median]), "NOTIFY -> Redis push -> pop, p50"),
            Row(f"idle, {name}: commit -> Claimed p99", "ms", Stat.of([percentile(_ms(claimed), 99)]), p99,
                "NOTIFY -> Redis push -> pop, p99", value_at_most(50, "p99 <= 50 ms")),
            Row(f"idle, {name}: commit -> Completed p50 / p99", "ms",
                Stat.of([percentile(_ms(finished), 50), percentile(_ms(finished), 99)]),
                note="range shows p50-p99"),
        ]
    under_load = ctx.shared.get("wakeup_under_load")
    if under_load:
        claimed, finished = under_load
        outcome.rows += [
            Row("under the end-to-end load: commit -> Claimed p50 / p99", "ms",
                Stat.of([percentile(_ms(claimed), 50), percentile(_ms(claimed), 99)]), note="range shows p50-p99"),
            Row("under the end-to-end load: commit -> Completed p50 / p99", "ms",
                Stat.of([percentile(_ms(finished), 50), percentile(_ms(finished), 99)]), note="range shows p50-p99"),
        ]
        outcome.notes.append("Under load the creator keeps 4 exports per worker thread outstanding, so these "
                             "include queueing behind that backlog (workload 1's exports).")
    outcome.notes.append(f"{sizes.wakeup_idle_samples} idle samples per variant, each created 1-2.5 s after the "
                         f"last one ended; timestamps are the database's (outbox created_at, event recorded_at).")
    outcome.series["idle commit -> Claimed, sorted vs sample"] = {
        name: list(enumerate(sorted(_ms(claimed)))) for name, (claimed, _) in variants.items()}
    return outcome


def slug_of(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _redis_commands_per_second(broker_url: str, seconds: float) -> float:
    client = redis.Redis.from_url(broker_url)
    try:
        before = client.info("stats")["total_commands_processed"]
        time.sleep(seconds)   # a measuring window
        return (client.info("stats")["total_commands_processed"] - before - 1) / seconds
    finally:
        client.close()


END_TO_END = Workload(
    "1", "End to end", "Exports of 100 contacts completed per second through the real relay, two worker processes "
    "(2 threads each) and the scheduler, delivering to a local SFTP partner, with a closed-loop creator; drift "
    "between the start and the end of a run, dead tuples and table growth. Ceiling: the slowest stage (build or "
    "upload of the same file to the same partner) measured alone at the same concurrency.", run_end_to_end)
WAKEUP = Workload("2", "Wake-up latency", "From the creation's commit to the Claimed and Completed events, "
                  "idle and under the end-to-end load; as shipped and with Dramatiq's idle poll shortened. "
                  "Ceiling: a NOTIFY round trip that pushes to a Redis list another client pops.", run_wakeup)
