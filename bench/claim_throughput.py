"""Claim throughput of the store against its ceiling: pgbench running the very same claim statement.

Both sides claim distinct queued jobs (each client walks its own ids), run as exports_app, with the
same number of clients and claims, on the same server in the same run; the figure to read is the
ratio, because these machines are shared and noisy.

    python -m bench.claim_throughput [--clients 4] [--claims 2000]

Uses EXPORTS_BENCH_DATABASE_URL (default: the local PostgreSQL at 127.0.0.1:5432) and creates a
scratch database there, which it drops at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import threading
import time
import uuid

import psycopg
from psycopg.conninfo import make_conninfo

from app.store import export
from app.store.database import connect
from app.store.types import Role
from bench import pgbench
from bench._scratch import base_url, create, drop, tenant_with_destination


def job_id(client: int, i: int, tag: str = "") -> uuid.UUID:
    return uuid.UUID(hashlib.md5(f"{tag}c{client}-{i}".encode()).hexdigest())


def seed(url: str, clients: int, claims: int, tag: str = "") -> None:
    """Queued jobs whose ids both sides can compute: md5('<tag>c<client>-<i>')."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenant, dest = tenant_with_destination(conn)
        with conn.transaction():
            conn.execute("SET CONSTRAINTS ALL DEFERRED")
            conn.execute(
                """
                WITH ids AS (
                    SELECT md5(%(tag)s || 'c' || c || '-' || i)::uuid AS id, 'k-' || %(tag)s || c || '-' || i AS key
                    FROM generate_series(0, %(clients)s - 1) c, generate_series(1, %(claims)s) i),
                d AS (INSERT INTO deliveries SELECT %(tenant)s, key, id, 'contacts-' || key || '.csv' FROM ids)
                INSERT INTO export_jobs
                    (id, tenant_id, status, version, destination_id, delivery_key, created_by, woken_at)
                SELECT id, %(tenant)s, 'Queued', 1, %(dest)s, key, 'bench', clock_timestamp() FROM ids
                """,
                dict(clients=clients, claims=claims, tenant=tenant, dest=dest, tag=tag))
        conn.execute("VACUUM ANALYZE export_jobs")


def pgbench_script(tag: str = "") -> str:
    """The claim statement with pgbench variables in place of psycopg parameters."""
    return "\\set i :i + 1\n" + pgbench.statement("export_claim", {
        "job_id": f"md5('{tag}c' || :client_id || '-' || :i)::uuid",
        "checked_version": "1",
        "attempt_id": "gen_random_uuid()",
        "worker_id": "'pgbench'",
        "lease_seconds": "60",
    }) + "\n"


def run_pgbench(url: str, clients: int, claims: int, tag: str = "", options: str = "") -> float:
    return pgbench.run(url, [pgbench_script(tag)], clients=clients, transactions=claims, variables={"i": 0},
                       options=options).tps


def run_store(url: str, clients: int, claims: int, tag: str = "", options: str = "") -> float:
    if options:
        url = make_conninfo(url, options=options)
    barrier = threading.Barrier(clients + 1)
    claimed = [0] * clients

    def client(c: int) -> None:
        conn = connect(url, Role.APP)
        barrier.wait()
        for i in range(1, claims + 1):
            claimed[c] += export.try_claim(conn, job_id=job_id(c, i, tag), checked_version=1,
                                           attempt_id=uuid.uuid4(), worker_id="bench", lease_seconds=60)
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    assert sum(claimed) == clients * claims, f"claimed {sum(claimed)} of {clients * claims}"
    return clients * claims / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--claims", type=int, default=2000, help="claims per client")
    args = parser.parse_args()
    base = base_url()
    name = f"exports_bench_{os.getpid()}"

    # Each side runs twice on a freshly seeded database, in alternating order, and keeps its best run,
    # so neither gains from going second (warm caches) or loses to a checkpoint the seeding started.
    ceiling = store = 0.0
    for first, second in ((run_pgbench, run_store), (run_store, run_pgbench)):
        for run in (first, second):
            url = create(base, name)
            seed(url, args.clients, args.claims)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CHECKPOINT")
            rate = run(url, args.clients, args.claims)
            if run is run_pgbench:
                ceiling = max(ceiling, rate)
            else:
                store = max(store, rate)
    drop(base, name)
    print(f"claims: {args.clients} clients x {args.claims}")
    print(f"  pgbench, same statement (ceiling): {ceiling:10.0f} claims/s")
    print(f"  app.store.export.try_claim:          {store:10.0f} claims/s")
    print(f"  ratio store / ceiling:             {store / ceiling:10.2f}")


if __name__ == "__main__":
    main()
