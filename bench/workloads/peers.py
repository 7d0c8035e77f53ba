"""Workload 8: the same no-op job through Procrastinate, pgqueuer and our protocol, on one PostgreSQL.

Each side enqueues N jobs one at a time, then one worker (concurrency 1) runs them all until its
queue is empty; the figure is N over both phases. Procrastinate (``defer_async``, then
``run_worker_async(wait=False)``) and pgqueuer (``Queries.enqueue``, then ``QueueManager.run`` in drain
mode, its default batch of 10, timed to its last job's end) use their own schemas in a database of their own, with their
defaults. Ours, with ``app.store`` functions directly and no broker:

- protocol: ``export.create`` per job; the relay's ``claim_batch`` + ``mark_published`` in batches
  of 200; per job ``export.claim``, a no-op build, ``export.authorize_delivery``, a no-op delivery,
  ``export.finish_delivery`` Completed;
- as the runner does it: the same, plus its one read before the claim (``read_job``, which brings the
  destination, its circuit and a replacement's original), the baseline carried by cutoff 2 and the
  receipt and outcome by the terminal write.

Ours writes more per job than either peer: an attempt event per transition, the lease, the outbox
row and the deliveries row.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid

import psycopg

from app.store import export
from app.store import relay as relay_store
from app.store.database import Database, connect
from app.store.types import ExpectedFile, Role, Status
from app.store.worker import read_job
from bench import system
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, log, settle
from bench.peer_exports import asyncpg_connect

RELAY_BATCH = 200
EMPTY = ExpectedFile("contacts-noop.csv", 0, hashlib.sha256(b"").digest())


# --- peers -------------------------------------------------------------------------------------------


async def _procrastinate(url: str, jobs: int, install: bool) -> tuple[float, float]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(queue="bench", name="noop")
    async def noop() -> None:
        return None

    async with app.open_async():
        if install:
            await app.schema_manager.apply_schema_async()
            return 0.0, 0.0
        started = time.perf_counter()
        for _ in range(jobs):
            await noop.defer_async()
        enqueued = time.perf_counter()
        await app.run_worker_async(queues=["bench"], wait=False, concurrency=1, install_signal_handlers=False,
                                   listen_notify=False)
        return enqueued - started, time.perf_counter() - enqueued


async def _pgqueuer(url: str, jobs: int, install: bool) -> tuple[float, float]:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg_connect(url)
    driver = AsyncpgDriver(conn)
    queries = Queries(driver)
    if install:
        await queries.install()
        await conn.close()
        return 0.0, 0.0
    manager = QueueManager(queries)
    done = 0
    finished = 0.0

    @manager.entrypoint("noop")
    async def noop(job) -> None:
        nonlocal done, finished
        done += 1
        if done == jobs:
            # Timed to the last job's end: drain mode then idles about 5 s before it returns.
            finished = time.perf_counter()
            manager.shutdown.set()

    started = time.perf_counter()
    for _ in range(jobs):
        await queries.enqueue("noop", None)
    enqueued = time.perf_counter()
    await manager.run(mode=QueueExecutionMode.drain)
    await conn.close()
    if done != jobs:
        raise RuntimeError(f"pgqueuer ran {done} of {jobs} jobs")
    return enqueued - started, finished - enqueued


def peer(kind: str, url: str, jobs: int, *, install: bool = False) -> tuple[float, float]:
    """(seconds enqueueing, seconds working) for one peer."""
    runner = {"procrastinate": _procrastinate, "pgqueuer": _pgqueuer}[kind]
    return asyncio.run(runner(url, jobs, install))


# --- ours --------------------------------------------------------------------------------------------


def ours(url: str, jobs: int, tenant: uuid.UUID, destination: uuid.UUID, *, runner_path: bool) -> tuple[float, float]:
    with contextlib.closing(connect(url, Role.APP)) as conn, \
            Database(url, Role.DISPATCHER, min_size=1, max_size=1, name="bench-relay") as dispatcher, \
            Database(url, Role.APP, min_size=1, max_size=2, name="bench-worker") as db:
        started = time.perf_counter()
        for _ in range(jobs):
            system.create_export(conn, tenant, destination)
        enqueued = time.perf_counter()
        published: list[uuid.UUID] = []
        while True:
            with dispatcher.connection() as relay_conn, relay_conn.transaction():
                rows = relay_store.claim_batch(relay_conn, batch_size=RELAY_BATCH).rows
                if rows:
                    relay_store.mark_published(relay_conn, message_ids=[r.message_id for r in rows])
            published += [r.job_id for r in rows]
            if len(rows) < RELAY_BATCH:
                break
        for job_id in published:
            if runner_path:
                with db.connection() as c:
                    job = read_job(c, job_id)
                    assert job is not None and job.status is Status.QUEUED and job.destination is not None
            attempt = uuid.uuid4()
            export.claim(db, job_id=job_id, checked_version=1, attempt_id=attempt, worker_id="bench",
                         lease_seconds=60)
            carried = ['{"stage":"baseline"}'] if runner_path else []
            export.authorize_delivery(db, job_id=job_id, tenant_id=tenant, attempt_id=attempt, expected=EMPTY,
                                      replaces_job_id=None, evidence=carried, observed_by="bench")
            carried = ['{"stage":"receipt"}', '{"stage":"outcome"}'] if runner_path else []
            written = export.finish_delivery(db, job_id=job_id, attempt_id=attempt, worker_id="bench",
                                             outcome=Status.COMPLETED, evidence=carried, observed_by="bench")
            assert written.value == "Written", written
        return enqueued - started, time.perf_counter() - enqueued


# --- the workload ------------------------------------------------------------------------------------


def run(ctx: Context) -> Outcome:
    jobs = ctx.sizes.peer_jobs
    ours_url = ctx.fresh_database("peers_ours")
    peers_url = ctx.fresh_database("peers_theirs")
    with psycopg.connect(ours_url, autocommit=True) as owner:
        tenant, destination = tenant_with_destination(owner)
    installed = []
    unavailable: dict[str, str] = {}
    for kind in ("procrastinate", "pgqueuer"):
        try:
            peer(kind, peers_url, 0, install=True)
            installed.append(kind)
        except ImportError as exc:
            unavailable[kind] = f"not installed ({exc.name}); `pip install -e '.[bench]'`"
        except Exception as exc:   # reported in the page, the others still run
            unavailable[kind] = f"{type(exc).__name__}: {exc}"
    sides = {
        **{kind: (lambda kind=kind: peer(kind, peers_url, jobs)) for kind in installed},
        "ours, protocol": lambda: ours(ours_url, jobs, tenant, destination, runner_path=False),
        "ours, as the runner": lambda: ours(ours_url, jobs, tenant, destination, runner_path=True),
    }
    for name in sides:   # warm-up
        if name in installed:
            peer(name, peers_url, 20)
        else:
            ours(ours_url, 20, tenant, destination, runner_path=name.endswith("runner"))
    totals: dict[str, list[float]] = {name: [] for name in sides}
    working: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for round_ in range(ctx.repeats):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            settle(ours_url)
            settle(peers_url)
            enqueue, work = sides[name]()
            totals[name].append(jobs / (enqueue + work))
            working[name].append(jobs / work)
        log("   " + ", ".join(f"{n} {totals[n][-1]:.0f}/s" for n in names))
    outcome = Outcome()
    reference = "procrastinate" if "procrastinate" in installed else None
    for name in names:
        if name == reference:
            continue
        ceiling = Stat.of(totals[reference]) if reference else None
        goal = at_least(1.0) if name.startswith("ours") and reference else None
        outcome.rows.append(Row(f"{name}: no-op jobs, enqueue + run", "jobs/s", Stat.of(totals[name]), ceiling,
                                "Procrastinate" if reference else "", goal, versus="baseline"))
    if reference:
        outcome.rows.insert(0, Row("Procrastinate: no-op jobs, enqueue + run", "jobs/s", Stat.of(totals[reference])))
    for name in names:
        outcome.rows.append(Row(f"{name}: the worker's part alone", "jobs/s", Stat.of(working[name])))
    outcome.notes.append(f"{jobs:,} jobs per run, one worker at concurrency 1, each side alone on the server.")
    for kind, why in unavailable.items():
        outcome.notes.append(f"{kind} was not measured: {why}")
    return outcome


WORKLOAD = Workload("8", "Peers", "The same no-op job through Procrastinate, pgqueuer and our protocol path "
                    "(create, relay, claim, authorize, finish, with a no-op build and delivery, through "
                    "`app.store` directly) on the same PostgreSQL, jobs per second side by side.", run)
