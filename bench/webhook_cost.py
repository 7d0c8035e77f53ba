"""What telling the tenant's webhooks costs the statements that give exports their outcomes.

Each outcome statement carries a CTE (``webhook``) that inserts one delivery per live endpoint of the
job's tenant. A tenant without an endpoint must pay nothing for it; one with an endpoint pays one row.
This runs the real statements from several clients, one job per statement, on jobs prepared in bulk:

- ``without``: the statement with its ``webhook`` CTE cut out (the statement as it was before webhooks),
  for a tenant without an endpoint;
- ``quiet``: the statement as shipped, for a tenant without an endpoint;
- ``notified``: the statement as shipped, for a tenant with one endpoint (a delivery inserted per job).

for the worker's terminal write (``export_finish_delivery``, Delivering -> Completed) and the cancel of a
queued job (``cancellation_cancel_queued``). Each round runs the three variants back to back, in an order
that rotates from round to round; each variant's rate is compared with ``without``'s of the same round,
and the median of those ratios over the rounds is reported (a loaded machine moves whole rounds, which a
ratio within a round cancels). ``--synchronous-commit off`` (the default) leaves out the WAL flush every
variant pays alike, so the statements' own work is what differs. Then, closer still, the server's own
account: ``EXPLAIN ANALYZE`` of the terminal write per variant, its execution time and the time of its
``webhook`` CTE's node, medians over ``--explain`` statements.

    python -m bench.webhook_cost [--clients 1] [--jobs 2000] [--rounds 5] [--synchronous-commit off]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from app.store.database import connect
from app.store.statements import STATEMENTS
from app.store.types import Role
from bench._scratch import base_url, create, drop, tenant_with_destination

#: The CTE every outcome statement carries, and the comma that joins it to the one before.
_WEBHOOK_CTE = re.compile(r",\s*webhook AS \(\s*INSERT INTO webhook_deliveries .*?w\.removed_at IS NULL\)", re.DOTALL)
STATEMENTS_MEASURED = ("export_finish_delivery", "cancellation_cancel_queued")
VARIANTS = ("without", "quiet", "notified")


def without_webhook(text: str) -> str:
    cut, n = _WEBHOOK_CTE.subn("", text)
    assert n == 1, "the statement carries one webhook CTE"
    return cut


@dataclass
class Round:
    rate: float
    p50_ms: float
    p99_ms: float


def _prepare(owner: psycopg.Connection, tenant: uuid.UUID, destination: uuid.UUID, status: str,
             n: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """``n`` jobs of the tenant in ``status`` (Queued or Delivering), inserted in bulk as the owner: (job,
    attempt)."""
    jobs = [(uuid.uuid4(), uuid.uuid4()) for _ in range(n)]
    with owner.transaction():
        owner.execute(
            "WITH j AS (SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::uuid[]) AS x (id, attempt)),"
            " d AS (INSERT INTO deliveries (tenant_id, delivery_key, original_job_id, file_name)"
            "       SELECT %(tenant)s, id::text, id, 'f-' || id || '.csv' FROM j)"
            " INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, attempt_id, attempt_count,"
            "                          delivery_key, created_by, woken_at, lease_expires_at, expected_file_name,"
            "                          expected_file_bytes, expected_file_sha256, delivery_authorized_at)"
            " SELECT id, %(tenant)s, %(status)s, 1, %(destination)s,"
            "        CASE WHEN %(status)s = 'Delivering' THEN attempt END, 1, id::text, 'bench', clock_timestamp(),"
            "        CASE WHEN %(status)s = 'Delivering' THEN clock_timestamp() + interval '1 hour' END,"
            "        'f-' || id || '.csv', 100, '\\x00'::bytea, clock_timestamp() FROM j",
            dict(ids=[j for j, _ in jobs], attempts=[a for _, a in jobs], tenant=tenant, destination=destination,
                 status=status))
    owner.execute("VACUUM ANALYZE export_jobs")
    return jobs


def _params(statement: str, tenant: uuid.UUID, job: uuid.UUID, attempt: uuid.UUID) -> dict:
    if statement == "export_finish_delivery":
        return dict(job_id=job, attempt_id=attempt, worker_id="bench", outcome="Completed", failure_reason=None,
                    detail=None, cause=None, evidence=[], observed_by=None)
    return dict(job_id=job, tenant_id=tenant, request_id=uuid.uuid4())


def _run(url: str, clients: int, text: str, work: list[tuple[uuid.UUID, uuid.UUID]],
         params: Callable[[uuid.UUID, uuid.UUID], dict], synchronous_commit: str) -> Round:
    barrier = threading.Barrier(clients + 1)
    chunks = [work[i::clients] for i in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]

    def client(n: int) -> None:
        conn = connect(url, Role.APP)
        conn.execute("SELECT set_config('synchronous_commit', %s, false)", (synchronous_commit,))
        cur = conn.cursor()
        barrier.wait()
        for job, attempt in chunks[n]:
            started = time.perf_counter()
            cur.execute(text, params(job, attempt), prepare=True)
            assert cur.rowcount == 1, cur.rowcount
            latencies[n].append(time.perf_counter() - started)
        conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    flat = sorted(x for per in latencies for x in per)
    return Round(len(flat) / elapsed, statistics.median(flat) * 1000, flat[int(len(flat) * 0.99) - 1] * 1000)


def _explained(owner: psycopg.Connection, tenant: uuid.UUID, destination: uuid.UUID, variant: str,
               n: int) -> tuple[float, float | None]:
    """The median execution time of the terminal write over ``n`` jobs, and of its webhook CTE's node
    (None without it), in milliseconds, as the server accounts for them."""
    text = STATEMENTS["export_finish_delivery"]
    text = without_webhook(text) if variant == "without" else text
    executions, nodes = [], []
    for job, attempt in _prepare(owner, tenant, destination, "Delivering", n):
        plan = owner.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text,
                             _params("export_finish_delivery", tenant, job, attempt)).fetchone()[0][0]
        executions.append(plan["Execution Time"])
        stack = [plan["Plan"]]
        while stack:
            node = stack.pop()
            if node.get("Node Type") == "ModifyTable" and node.get("Relation Name") == "webhook_deliveries":
                nodes.append(node["Actual Total Time"])
            stack.extend(node.get("Plans", []))
    return statistics.median(executions), statistics.median(nodes) if nodes else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2000, help="statements per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--synchronous-commit", choices=("on", "off"), default="off")
    parser.add_argument("--explain", type=int, default=400, help="statements explained per variant (0: none)")
    args = parser.parse_args()
    base = base_url()
    name = f"exports_bench_webhooks_{os.getpid()}"
    url = create(base, name)
    rounds: dict[tuple[str, str], list[Round]] = {}
    try:
        with psycopg.connect(url, autocommit=True) as owner:
            quiet = tenant_with_destination(owner)
            notified = tenant_with_destination(owner)
            owner.execute("INSERT INTO webhook_endpoints (id, tenant_id, name, url, secret_ref, created_by)"
                          " VALUES (%s, %s, 'hooks', 'https://hooks.example/', 'env:HOOK', 'bench')",
                          (uuid.uuid4(), notified[0]))
            for n in range(args.rounds):
                for statement in STATEMENTS_MEASURED:
                    status = "Delivering" if statement == "export_finish_delivery" else "Queued"
                    for variant in VARIANTS[n % 3:] + VARIANTS[:n % 3]:
                        tenant, destination = notified if variant == "notified" else quiet
                        text = f"/* {statement} */ " + (without_webhook(STATEMENTS[statement])
                                                       if variant == "without" else STATEMENTS[statement])
                        work = _prepare(owner, tenant, destination, status, args.jobs)
                        owner.execute("CHECKPOINT")
                        result = _run(url, args.clients, text, work,
                                      lambda job, attempt, s=statement, t=tenant: _params(s, t, job, attempt),
                                      args.synchronous_commit)
                        rounds.setdefault((statement, variant), []).append(result)
            delivered = owner.execute("SELECT count(*) FROM webhook_deliveries").fetchone()
            explained = {v: _explained(owner, *(notified if v == "notified" else quiet), v, args.explain)
                         for v in VARIANTS} if args.explain else {}
    finally:
        drop(base, name)
    print(f"outcome statements: {args.clients} client(s) x {args.jobs} jobs per variant per round, {args.rounds} "
          f"rounds, synchronous_commit {args.synchronous_commit}; medians over the rounds")
    for statement in STATEMENTS_MEASURED:
        without = rounds[(statement, "without")]
        print(f"  {statement}")
        for variant in VARIANTS:
            mine = rounds[(statement, variant)]
            ratio = statistics.median(m.rate / w.rate for m, w in zip(mine, without, strict=True))
            print(f"    {variant:9s} {statistics.median(r.rate for r in mine):8.0f}/s  "
                  f"p50 {statistics.median(r.p50_ms for r in mine):6.3f} ms  "
                  f"p99 {statistics.median(r.p99_ms for r in mine):6.3f} ms  x{ratio:5.3f} of without")
    print(f"  deliveries written for the notified tenant: {delivered[0] if delivered else 0}")
    for variant, (execution, node) in explained.items():
        print(f"  EXPLAIN ANALYZE export_finish_delivery {variant:9s} execution p50 {execution * 1000:7.1f} us, "
              f"webhook CTE p50 {'-' if node is None else f'{node * 1000:6.1f} us'}")


if __name__ == "__main__":
    main()
