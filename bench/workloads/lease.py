"""Workload 4: keeping 1,000 running attempts' leases renewed.

Ours: 1,000 real ``LeaseKeeper``s on one APScheduler scheduler (the worker's 16 threads), each renewing
its Running attempt every ``renew_seconds`` with ``export_lease_renew``, for two rounds, sharing one
pool of 16 connections as the keepers of a worker process share theirs. Measured: commits per second,
CPU per renewal in this process and in the PostgreSQL backends, how long each round takes, the
HOT-update ratio on ``export_jobs``, and what one connection per attempt costs to open. Ceiling:
pgbench running ``export_lease_renew`` on the same rows with as many clients (16), flat out.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg

from app.actors.lease import SCHEDULER_THREADS, LeaseKeeper, new_scheduler
from app.actors.stop import StopSignal
from app.store.database import Database, connect
from app.store.types import RenewResult, Role
from bench import pgbench, system
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, at_most, log, settle

#: The production interval the goal is judged at, in seconds (Settings.renew_seconds).
PRODUCTION_RENEW_SECONDS = 20.0
ROUNDS = 2


def seed_running(url: str, attempts: int) -> None:
    """``attempts`` Running jobs: job md5('j<i>'), attempt md5('a<i>'), leases an hour out."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenant, destination = tenant_with_destination(conn)
        with conn.transaction():
            conn.execute("SET CONSTRAINTS ALL DEFERRED")
            conn.execute(
                """
                WITH ids AS (SELECT md5('j' || i)::uuid AS id, md5('a' || i)::uuid AS attempt, 'k' || i AS key
                             FROM generate_series(1, %(n)s) i),
                d AS (INSERT INTO deliveries SELECT %(tenant)s, key, id, 'contacts-' || key || '.csv' FROM ids)
                INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by,
                                         woken_at, attempt_id, attempt_count, claimed_by, lease_expires_at)
                SELECT id, %(tenant)s, 'Running', 1, %(dest)s, key, 'bench', clock_timestamp(), attempt, 1, 'bench',
                       clock_timestamp() + interval '1 hour' FROM ids
                """, dict(n=attempts, tenant=tenant, dest=destination))


def hot_counts(url: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'export_jobs'"
                           ).fetchone()
    return row[0], row[1]


def keep_renewed(url: str, attempts: int, renew_seconds: float) -> dict:
    """Two rounds of renewals of every attempt; what they cost."""
    pool = Database(url, Role.APP, min_size=SCHEDULER_THREADS, max_size=SCHEDULER_THREADS, name="bench-lease")
    scheduler = new_scheduler()
    keepers: list[LeaseKeeper] = []
    try:
        server_before = system.backend_cpu(url)
        client_before = time.process_time()
        started = time.monotonic()
        for i in range(1, attempts + 1):
            keeper = LeaseKeeper(db=pool, job_id=uuid.UUID(_md5(f"j{i}")), attempt_id=uuid.UUID(_md5(f"a{i}")),
                                 lease_seconds=60, renew_seconds=renew_seconds, scheduler=scheduler,
                                 stop=StopSignal())
            keeper.start()
            keepers.append(keeper)
        # Two rounds, then half an interval for the second to finish.
        threading.Event().wait(renew_seconds * (ROUNDS + 0.5))   # the measuring window itself
        client_cpu = time.process_time() - client_before
        server_cpu = system.backend_cpu(url) - server_before
        history = [r for k in keepers for r in k.history]
    finally:
        scheduler.shutdown(wait=True)
        for keeper in keepers:
            keeper._finished.set()   # the shared pool is closed below, once
        pool.close()
    renewed = [r for r in history if r.result is RenewResult.RENEWED]
    rounds = []
    for k in range(ROUNDS):
        lo, hi = started + renew_seconds * (k + 0.5), started + renew_seconds * (k + 1.5)
        inside = [r for r in renewed if lo <= r.started < hi]
        if inside:
            rounds.append(max(r.ended for r in inside) - min(r.started for r in inside))
    return {"renewed": len(renewed), "failed": len(history) - len(renewed),
            "rate": len(renewed) / (renew_seconds * ROUNDS),
            "client_us": 1e6 * client_cpu / max(len(renewed), 1), "server_us": 1e6 * server_cpu / max(len(renewed), 1),
            "round_seconds": max(rounds) if rounds else float("nan")}


def _md5(text: str) -> str:
    import hashlib

    return hashlib.md5(text.encode()).hexdigest()


def connect_ms(url: str, samples: int = 20) -> list[float]:
    """What the product pays per attempt today: one new connection under the app role."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        connect(url, Role.APP).close()
        times.append((time.perf_counter() - started) * 1000)
    return times


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    n, renew = sizes.lease_attempts, sizes.lease_renew_seconds
    url = ctx.fresh_database("lease", lambda u: seed_running(u, n))
    script = ("\\set i random(1, " + str(n) + ")\n" + pgbench.statement("export_lease_renew", {
        "job_id": "md5('j' || :i)::uuid", "attempt_id": "md5('a' || :i)::uuid", "lease_seconds": "60"}) + "\n")
    runs: list[dict] = []
    hot_before = hot_counts(url)

    def ceiling() -> float:
        result = pgbench.run(url, [script], clients=SCHEDULER_THREADS, seconds=max(3.0, renew))
        log(f"   pgbench renewals {result.tps:.0f}/s")
        return result.tps

    def ours() -> float:
        runs.append(keep_renewed(url, n, renew))
        log(f"   keepers {runs[-1]['rate']:.0f} renewals/s, {runs[-1]['failed']} failed")
        return runs[-1]["rate"]

    keep_renewed(url, min(n, 100), 1.0)   # warm-up
    ceilings, ourselves = ctx.paired(ceiling, ours, prepare=lambda: settle(url))
    time.sleep(1)   # closed backends report their statistics as they exit
    upd, hot = (a - b for a, b in zip(hot_counts(url), hot_before, strict=True))
    scale = renew / PRODUCTION_RENEW_SECONDS
    outcome = Outcome()
    outcome.rows += [
        Row(f"commits/s keeping {n:,} attempts renewed every {renew:g} s", "commits/s", Stat.of(ourselves),
            Stat.of(ceilings), f"pgbench, same statement, {SCHEDULER_THREADS} clients"),
        Row(f"the same at the production interval ({PRODUCTION_RENEW_SECONDS:g} s)", "commits/s",
            Stat.of([x * scale for x in ourselves]), Stat.of(ceilings),
            f"pgbench, same statement, {SCHEDULER_THREADS} clients", at_most(0.05, "<= 0.05x")),
        Row("CPU per renewal, this process (keepers and scheduler)", "µs", Stat.of([r["client_us"] for r in runs])),
        Row("CPU per renewal, PostgreSQL backends", "µs", Stat.of([r["server_us"] for r in runs])),
        Row(f"longest round: {n:,} renewals due at once", "s", Stat.of([r["round_seconds"] for r in runs])),
        Row("HOT updates on export_jobs during the runs", "fraction", Stat.of([hot / upd if upd else float("nan")])),
        Row("opening one app-role connection (what a keeper paid per attempt before the pool)", "ms",
            Stat.of(connect_ms(url))),
    ]
    failed = sum(r["failed"] for r in runs)
    outcome.notes += [
        f"{n:,} keepers share one pool of {SCHEDULER_THREADS} connections, as the keepers of a worker process share "
        "theirs (before, each attempt opened a connection of its own, and 1,000 would exceed max_connections).",
        f"Every round renewed every attempt: {'yes' if failed == 0 else f'no, {failed} renewals failed'}; "
        f"{ROUNDS} rounds per run; the production-interval row scales the commits by "
        f"{renew:g}/{PRODUCTION_RENEW_SECONDS:g} "
        "(each renewal is one commit).",
    ]
    return outcome


WORKLOAD = Workload("4", "Lease renewal", "Commits per second and CPU to keep 1,000 running attempts renewed "
                    "with the real lease keepers, the HOT-update ratio on `export_jobs`, against pgbench running "
                    "`export_lease_renew` flat out at the same concurrency.", run)
