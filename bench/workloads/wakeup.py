"""Workload 2: how soon a created export starts, from the creation's commit (its outbox row's
``created_at``) to the Claimed event and to the Finished (Completed) event, all on the database's
clock: under the end-to-end load (workload 1's exports) and idle (one export at a time, 1-2.5 s
apart), as shipped and with the Dramatiq consumer's idle poll shortened (``dramatiq_worker_timeout``,
an environment variable Dramatiq reads; no product change). Ceiling: the bare path, a NOTIFY round
trip that pushes to a Redis list another client pops.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid

import psycopg
import redis

from app.store.database import connect
from app.store.types import Role
from bench import system
from bench.harness import Context, Outcome, Row, Stat, Workload, percentile, value_at_most

WORKERS = 2
THREADS = 2
#: The shortened idle poll for the tuned variant, in milliseconds.
TUNED_WORKER_TIMEOUT_MS = 50
TERMINAL = ("Completed", "Failed", "OutcomeUnknown", "Stopped", "Canceled", "Rejected")


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
            job_id = system.create_export(conn, tenant, destination)
            jobs.append(job_id)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status = conn.execute("SELECT status FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
                if status["status"] in TERMINAL:
                    break
                time.sleep(0.02)
    return jobs


# --- the workload --------------------------------------------------------------------------------------


def _ms(values: list[float]) -> list[float]:
    return [v * 1000 for v in values]


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


WAKEUP = Workload("2", "Wake-up latency", "From the creation's commit to the Claimed and Completed events, "
                  "idle and under the end-to-end load; as shipped and with Dramatiq's idle poll shortened. "
                  "Ceiling: a NOTIFY round trip that pushes to a Redis list another client pops.", run_wakeup)
