"""Workload 10: the operator's views with a long history.

100,000 jobs (of two tenants, in every status) and 300,000 outbox rows. Ours: the reads behind
``exports list`` (all, one tenant, one rare status), ``exports watch`` (counts by status and the newest
jobs) and ``exports show`` (one job's row, events, requests and outbox), through ``app.store.views``
as the commands run them, read-only, as exports_app. Ceiling: the list's own SQL (newest 100 by
``created_at``) sent raw through psycopg on an open connection. Goal: ``exports list`` answers in
under 100 ms; the command's whole wall time, Python's start-up included, is shown too.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import psycopg

from app.store.types import Role, Status
from app.store.views import Views
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, log, value_at_most

JOBS = 100_000
OUTBOX_PER_JOB = 3
SAMPLES = 20
LIST_LIMIT = 100


def seed(url: str) -> None:
    """JOBS jobs over two tenants, created over the last 30 days, mostly Completed; three outbox rows each."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenants = [tenant_with_destination(conn) for _ in range(2)]
        with conn.transaction():
            conn.execute("SET CONSTRAINTS ALL DEFERRED")
            for index, (tenant, destination) in enumerate(tenants):
                conn.execute(
                    """
                    WITH ids AS (SELECT i, md5(%(t)s || 'job' || i)::uuid AS id, %(t)s || 'k' || i AS key
                                 FROM generate_series(1, %(n)s) i),
                    d AS (INSERT INTO deliveries SELECT %(tenant)s, key, id, 'contacts-' || key || '.csv' FROM ids)
                    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key,
                                             created_by, woken_at, created_at, failure_reason)
                    SELECT id, %(tenant)s,
                           CASE WHEN i %% 1000 = 0 THEN 'Failed' WHEN i %% 100 = 1 THEN 'Queued'
                                WHEN i %% 250 = 2 THEN 'OutcomeUnknown' ELSE 'Completed' END,
                           1, %(dest)s, key, 'bench', now(), now() - (i * interval '25 seconds'),
                           CASE WHEN i %% 1000 = 0 THEN 'NotDelivered' END
                    FROM ids""", dict(t=str(index), n=JOBS // 2, tenant=tenant, dest=destination))
            conn.execute("""
                INSERT INTO outbox (message_id, kind, job_id, created_at, published_at)
                SELECT gen_random_uuid(), 'ExportReady', j.id, j.created_at + r * interval '1 minute',
                       j.created_at + r * interval '1 minute'
                FROM export_jobs j, generate_series(0, %(per)s - 1) r""", dict(per=OUTBOX_PER_JOB))


def _median_ms(read: Callable[[], object]) -> tuple[Stat, list[float]]:
    samples = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        read()
        samples.append((time.perf_counter() - started) * 1000)
    return Stat.of(samples), samples


def run(ctx: Context) -> Outcome:
    url = ctx.fresh_database("views", seed)
    outcome = Outcome()
    with psycopg.connect(url, autocommit=True) as owner:
        tenant = owner.execute("SELECT tenant_id FROM export_jobs LIMIT 1").fetchone()[0]
        some_job = owner.execute("SELECT id FROM export_jobs WHERE tenant_id = %s LIMIT 1", (tenant,)).fetchone()[0]
        outbox_rows = owner.execute("SELECT count(*) FROM outbox").fetchone()[0]
    log(f"   views: {JOBS:,} jobs, {outbox_rows:,} outbox rows")
    with Views(url, Role.APP) as views, psycopg.connect(url, autocommit=True) as raw:
        raw.execute("SET ROLE exports_app")
        views.counts_by_status()   # connects, and warms the caches the way a second command would find them
        job = views.job(tenant, some_job)
        assert job is not None

        def ceiling() -> object:
            return raw.execute("SELECT id FROM export_jobs ORDER BY created_at DESC, id DESC LIMIT %s",
                               (LIST_LIMIT,)).fetchall()

        reads: list[tuple[str, Callable[[], object], bool]] = [
            ("exports list (newest 100 of all)", lambda: views.jobs(limit=LIST_LIMIT), True),
            ("exports list --tenant", lambda: views.jobs(tenant_id=tenant, limit=LIST_LIMIT), False),
            ("exports list --status Failed (rare)", lambda: views.jobs(status=Status.FAILED, limit=LIST_LIMIT), False),
            ("exports watch (counts by status + newest 15)",
             lambda: (views.counts_by_status(), views.jobs(limit=15)), False),
            ("exports show (row, events, requests, outbox)", lambda: views.history(job), False),
        ]
        ceiling_stat, _ = _median_ms(ceiling)
        for name, read, with_ceiling in reads:
            stat, _ = _median_ms(read)
            outcome.rows.append(Row(name, "ms", stat, ceiling_stat if with_ceiling else None,
                                    "the list's SQL, raw psycopg" if with_ceiling else "",
                                    value_at_most(100, "<= 100 ms")))
    environ = dict(os.environ, EXPORTS_DATABASE_URL=url)
    walls = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "app.cli", "list", "--json"], env=environ, check=True,
                       capture_output=True)
        walls.append((time.perf_counter() - started) * 1000)
    outcome.rows.append(Row("the whole `exports list` command, Python's start-up included", "ms", Stat.of(walls)))
    outcome.notes.append(f"{JOBS:,} jobs in two tenants, {outbox_rows:,} outbox rows; medians of {SAMPLES} reads "
                         f"on an open read-only connection; the command's wall time over 5 runs "
                         f"(median {statistics.median(walls):.0f} ms).")
    ctx.drop_databases()
    return outcome


WORKLOAD = Workload("10", "Operator views with a long history", "How long `exports list`, `watch` and `show` take "
                    f"to read with {JOBS:,} jobs and {JOBS * OUTBOX_PER_JOB:,} outbox rows, against the list's own "
                    "SQL sent raw; goal: under 100 ms.", run)
