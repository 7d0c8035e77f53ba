"""Workload 5: recovery and the sweeper as the table grows.

Two databases, a small and a large ``export_jobs`` (100k and 1M in full mode), each with the same
number of due rows: expired Running attempts for recovery, and Queued jobs whose last wake-up is past
the sweeper's threshold; the rest are mostly Completed, with a few live Running and fresh Queued jobs.
Ours: ``Recovery.run_once`` and ``Sweeper.run_once`` (their batches timed through the store functions
they call). Against pgbench on the same rows, one client, as each service runs: for the sweeper a
ceiling, its batch statement; for recovery a baseline, its scan once per 100 rows and its requeue per
row, which ours, requeueing a batch at a time, beats.
EXPLAIN shows which index each scan uses.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from itertools import pairwise

import psycopg

from app.maintenance.recovery import Recovery, RecoveryConfig
from app.maintenance.sweeper import Sweeper, SweeperConfig
from app.store import connector
from app.store import recovery as recovery_store
from app.store import sweeper as sweeper_store
from app.store.database import Database
from app.store.types import Role
from bench import pgbench
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, at_most, log, percentile, settle

MAX_ATTEMPTS = 5
RECOVERY_BATCH = 100
SWEEP_AFTER_SECONDS = 1800.0
SWEEP_BATCH = 500


def seed(url: str, jobs: int, due: int) -> None:
    """Jobs md5('job<i>'): 1..due expired Running, due+1..2*due stale Queued, the rest mostly Completed."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenant, destination = tenant_with_destination(conn)
        with conn.transaction():
            conn.execute("SET CONSTRAINTS ALL DEFERRED")
            conn.execute(
                """
                WITH ids AS (SELECT i, md5('job' || i)::uuid AS id, 'k' || i AS key FROM generate_series(1, %(n)s) i),
                d AS (INSERT INTO deliveries SELECT %(tenant)s, key, id, 'contacts-' || key || '.csv' FROM ids),
                shaped AS (
                    SELECT i, id, key,
                           CASE WHEN i <= %(due)s THEN 'Running' WHEN i <= 2 * %(due)s THEN 'Queued'
                                WHEN i %% 100 = 0 THEN 'Running' WHEN i %% 100 = 1 THEN 'Queued'
                                ELSE 'Completed' END AS status
                    FROM ids)
                INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by,
                                         woken_at, attempt_id, attempt_count, claimed_by, lease_expires_at)
                SELECT id, %(tenant)s, status, 1, %(dest)s, key, 'bench',
                       CASE WHEN i <= 2 * %(due)s THEN now() - interval '2 hours' + i * interval '1 ms'
                            ELSE now() - interval '1 minute' END,
                       CASE WHEN status = 'Queued' THEN NULL ELSE md5('att0-' || i)::uuid END,
                       CASE WHEN status = 'Queued' THEN 0 ELSE 1 END,
                       CASE WHEN status = 'Queued' THEN NULL ELSE 'bench' END,
                       CASE WHEN i <= %(due)s THEN now() - interval '1 hour' + i * interval '1 ms'
                            WHEN status = 'Running' THEN now() + interval '1 hour' END
                FROM shaped
                """, dict(n=jobs, due=due, tenant=tenant, dest=destination))


def reset_recovery(url: str, due: int, round_: int) -> None:
    """The due jobs expired Running again, under attempt md5('att<round>-<i>') (a takeover event is
    once per attempt, so every round needs new attempt ids)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE export_jobs SET status = 'Running', attempt_id = md5('att' || %(r)s || '-' || i)::uuid,"
            " claimed_by = 'bench', lease_expires_at = now() - interval '1 hour' + i * interval '1 ms'"
            " FROM generate_series(1, %(due)s) i WHERE id = md5('job' || i)::uuid", dict(r=round_, due=due))


def reset_sweeper(url: str, due: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE export_jobs SET woken_at = now() - interval '2 hours' + i * interval '1 ms'"
            " FROM generate_series(%(due)s + 1, 2 * %(due)s) i WHERE id = md5('job' || i)::uuid", dict(due=due))


@contextmanager
def timing_batches(module, name: str):
    """Records when each call of ``module.name`` started, through the module attribute the service
    looks up at call time."""
    starts: list[float] = []
    original = getattr(module, name)

    def timed(*args, **kwargs):
        starts.append(time.perf_counter())
        return original(*args, **kwargs)

    setattr(module, name, timed)
    try:
        yield starts
    finally:
        setattr(module, name, original)


def batch_times(starts: list[float], ended: float) -> list[float]:
    bounds = starts + [ended]
    return [b - a for a, b in pairwise(bounds)]


def explain(url: str, name: str, params: dict) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET ROLE exports_app")
        rows = conn.execute("EXPLAIN " + connector.text(name), params).fetchall()
    return "\n".join(r[0] for r in rows)


def measure_scale(ctx: Context, jobs: int, due: int) -> dict:
    label = f"{jobs // 1000}k"
    url = ctx.fresh_database(f"scale_{label}", lambda u: seed(u, jobs, due))
    rounds = iter(range(1, 1000))
    result: dict = {"recovery_batches": [], "sweeper_batches": []}
    recovery_script = (
        "\\set i :i + 1\n"
        f"\\if :i % {RECOVERY_BATCH} = 1\n"
        + pgbench.statement("recovery_scan_expired", {"batch_size": str(RECOVERY_BATCH)}) + "\n"
        "\\endif\n"
        + pgbench.statement("recovery_requeue_expired", {
            "job_id": "md5('job' || :i)::uuid", "expired_attempt_id": "md5('att' || :r || '-' || :i)::uuid",
            "max_attempts": str(MAX_ATTEMPTS), "recovery_run_id": "'pgbench'"}) + "\n")
    sweeper_script = pgbench.statement("sweeper_republish_due", {
        "sweep_after_seconds": str(SWEEP_AFTER_SECONDS), "batch_size": str(SWEEP_BATCH)}) + "\n"
    current = {"round": 0}

    def prepare_recovery() -> None:
        current["round"] = next(rounds)
        reset_recovery(url, due, current["round"])
        settle(url)

    with Database(url, Role.APP, min_size=1, max_size=4, name="bench-scale") as db:
        recovery = Recovery(db, RecoveryConfig(max_attempts=MAX_ATTEMPTS, batch_size=RECOVERY_BATCH),
                            inspect_destination=lambda job: None)
        sweeper = Sweeper(db, SweeperConfig(sweep_after_seconds=SWEEP_AFTER_SECONDS, batch_size=SWEEP_BATCH))

        def recovery_ours() -> float:
            with timing_batches(recovery_store, "scan_expired") as starts:
                started = time.perf_counter()
                counts = recovery.run_once()
                ended = time.perf_counter()
            assert counts.requeued == due, counts
            result["recovery_batches"] += batch_times(starts, ended)[:-1] or [ended - started]
            return due / (ended - started)

        def recovery_ceiling() -> float:
            run = pgbench.run(url, [recovery_script], clients=1, transactions=due,
                              variables={"i": 0, "r": current["round"]})
            return run.tps

        def sweeper_ours() -> float:
            with timing_batches(sweeper_store, "republish_due") as starts:
                started = time.perf_counter()
                counts = sweeper.run_once()
                ended = time.perf_counter()
            assert counts.republished == due, counts
            result["sweeper_batches"] += batch_times(starts, ended)
            return due / (ended - started)

        def sweeper_ceiling() -> float:
            batches = due // SWEEP_BATCH + 1
            run = pgbench.run(url, [sweeper_script], clients=1, transactions=batches)
            return due / (batches / run.tps)

        recovery.run_once()   # warm-up: the seeded round 0
        sweeper.run_once()
        result["recovery"] = ctx.paired(recovery_ceiling, recovery_ours, prepare=prepare_recovery)
        result["sweeper"] = ctx.paired(sweeper_ceiling, sweeper_ours,
                                       prepare=lambda: (reset_sweeper(url, due), settle(url)))
    prepare_recovery()
    reset_sweeper(url, due)
    settle(url)
    result["explain"] = {
        f"EXPLAIN recovery_scan_expired at {label}": explain(url, "recovery_scan_expired",
                                                              {"batch_size": RECOVERY_BATCH}),
        f"EXPLAIN sweeper_republish_due at {label}": explain(url, "sweeper_republish_due", {
            "sweep_after_seconds": SWEEP_AFTER_SECONDS, "batch_size": SWEEP_BATCH}),
    }
    log(f"   {label}: recovery {Stat.of(result['recovery'][1]).median:.0f}/s vs "
        f"{Stat.of(result['recovery'][0]).median:.0f}/s, sweeper {Stat.of(result['sweeper'][1]).median:.0f}/s vs "
        f"{Stat.of(result['sweeper'][0]).median:.0f}/s")
    return result


def run(ctx: Context) -> Outcome:
    small_jobs, large_jobs = ctx.sizes.scale_jobs
    due = ctx.sizes.scale_due
    outcome = Outcome()
    results = {}
    for jobs in (small_jobs, large_jobs):
        results[jobs] = measure_scale(ctx, jobs, due)
        ctx.drop_databases()
        r = results[jobs]
        outcome.rows += [
            Row(f"recovery at {jobs:,} jobs, {due:,} expired", "rows/s", Stat.of(r["recovery"][1]),
                Stat.of(r["recovery"][0]), "pgbench, same scan + requeue per row, 1 client", at_least(0.7),
                versus="baseline"),
            Row(f"sweeper at {jobs:,} jobs, {due:,} due", "rows/s", Stat.of(r["sweeper"][1]),
                Stat.of(r["sweeper"][0]), "pgbench, same statement, 1 client", at_least(0.7)),
        ]
        outcome.details.update(r["explain"])
    for service in ("recovery", "sweeper"):
        p99 = {jobs: percentile(results[jobs][f"{service}_batches"], 99) * 1000 for jobs in results}
        outcome.rows.append(Row(f"{service}: p99 batch time at {large_jobs:,} vs at {small_jobs:,}", "ms",
                                Stat.of([p99[large_jobs]]), Stat.of([p99[small_jobs]]), f"p99 at {small_jobs:,}",
                                at_most(1.5), versus="baseline"))
    used = {title: [ix for ix in ("ix_export_jobs_lease", "ix_export_jobs_woken") if ix in text]
            for title, text in outcome.details.items()}
    outcome.notes += [f"{title}: uses {', '.join(ix) or 'no partial index'}" for title, ix in used.items()]
    outcome.notes.append(f"Recovery batches of {RECOVERY_BATCH} (its default), the sweeper's of {SWEEP_BATCH}; a "
                         "recovery batch is one scan and its takeovers, each on a connection from the pool.")
    return outcome


WORKLOAD = Workload("5", "Recovery and sweeper at scale", "Rows per second recovery requeues and the sweeper "
                    "republishes with a small and a large `export_jobs` holding the same number of due rows, "
                    "against pgbench running the same statements; p99 batch time at the large size against the "
                    "small one; EXPLAIN of both scans.", run)
