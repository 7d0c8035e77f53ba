r"""Workload 6: cancellation, uncontended and contended.

Uncontended: 4 clients cancel Queued jobs of their own through ``app.store.cancellation.
request_cancellation`` (lock, look up the request id, cancel, record: one transaction). Ceiling:
pgbench running the same four statements in one transaction, with the same lock timeout.

Contended: 4 clients each pick, at random, a cancel, a claim (``export_claim``) or a renewal
(``export_lease_renew``) of a random job among a few hundred, so cancels find jobs Queued, Running
(a stop request), stopped or canceled, and wait on the claims' and renewals' row locks. Ceiling:
pgbench running the same mix, its cancel transaction the same statements with the outcome derived in
SQL from the locked row (pgbench cannot branch on a string;
its ``\gset`` turns a NULL into an empty string, hence the NULLIFs). Deadlocks are counted on both sides.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
import uuid

import psycopg

from app.store import cancellation, export
from app.store.database import connect
from app.store.types import CancellationReply, Role
from bench import pgbench
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, log, percentile, settle, value_at_most

CLIENTS = 4
#: Jobs the contended mix works on: few, so operations meet on the same rows.
CONTENDED_JOBS = 200
#: A per-client stride for job numbers, so each client's jobs are its own.
STRIDE = 1_000_000


def _uuid(text: str) -> uuid.UUID:
    return uuid.UUID(hashlib.md5(text.encode()).hexdigest())


def seed_jobs(url: str, numbers: str) -> uuid.UUID:
    """Queued jobs md5('q<i>') for every i of the SQL set expression ``numbers``; returns the tenant."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenant, destination = tenant_with_destination(conn)
        with conn.transaction():
            conn.execute("SET CONSTRAINTS ALL DEFERRED")
            conn.execute(
                f"""
                WITH ids AS (SELECT md5('q' || i)::uuid AS id, 'k' || i AS key FROM ({numbers}) AS n (i)),
                d AS (INSERT INTO deliveries SELECT %(tenant)s, key, id, 'contacts-' || key || '.csv' FROM ids)
                INSERT INTO export_jobs
                    (id, tenant_id, status, version, destination_id, delivery_key, created_by, woken_at)
                SELECT id, %(tenant)s, 'Queued', 1, %(dest)s, key, 'bench', clock_timestamp() FROM ids
                """, dict(tenant=tenant, dest=destination))
    return tenant


def requeue_all(url: str) -> None:
    """Every job Queued again with no request or attempt, for the next round."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE export_jobs SET status = 'Queued', cancellation_request_id = NULL, stop_request_id = NULL,"
                     " attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL")


def _threads(n: int, target) -> float:
    barrier = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def body(c: int) -> None:
        try:
            target(c, barrier)
        except BaseException as exc:   # re-raised below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    started = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


# --- uncontended -------------------------------------------------------------------------------------


def cancel_script(tenant: uuid.UUID, *, contended: bool) -> str:
    keys = {"tenant_id": f"'{tenant}'::uuid", "request_id": "md5('rq' || :client_id || '-' || :n)::uuid"}
    if contended:
        keys["job_id"] = "md5('q' || :i)::uuid"
        found = {"outcome": "CASE WHEN :f_status = 'Queued' THEN 'CanceledWhileQueued'"
                            " WHEN :f_status = 'Running' AND NULLIF(:f_stop_request_id, '') IS NULL"
                            " THEN 'StopRequested'"
                            " WHEN :f_status = 'Running' THEN 'StopAlreadyRequested'"
                            " WHEN :f_status = 'Canceled' THEN 'AlreadyCanceled' ELSE 'AlreadyEnded' END",
                 "found_status": ":f_status", "found_attempt_id": "NULLIF(:f_attempt_id, '')::uuid",
                 "found_attempt_count": ":f_attempt_count::int",
                 "found_delivery_authorized_at": "NULLIF(:f_delivery_authorized_at, '')::timestamptz"}
        header = "\\set n :n + 1\n\\set i random(1, " + str(CONTENDED_JOBS) + ")\n"
    else:
        keys["job_id"] = f"md5('q' || (:client_id * {STRIDE} + :n))::uuid"
        found = {"outcome": "'CanceledWhileQueued'", "found_status": "'Queued'", "found_attempt_id": "NULL",
                 "found_attempt_count": "0", "found_delivery_authorized_at": "NULL"}
        header = "\\set n :n + 1\n"
    lock = pgbench.statement("cancellation_lock_job", keys).rstrip(";")
    lines = [header + "BEGIN;", "SELECT set_config('lock_timeout', '2s', true);",
             lock + (" \\gset f_" if contended else ";"),
             pgbench.statement("cancellation_find_request", keys),
             pgbench.statement("cancellation_cancel_queued", keys)]
    if contended:
        lines.append(pgbench.statement("cancellation_request_stop", keys))
    lines += [pgbench.statement("cancellation_record", dict(keys, requested_by="'pgbench'", reason="NULL", **found)),
              "COMMIT;"]
    return "\n".join(lines) + "\n"


def uncontended_ours(url: str, tenant: uuid.UUID, per_client: int, latencies: list[float]) -> float:
    def client(c: int, barrier: threading.Barrier) -> None:
        with contextlib.closing(connect(url, Role.APP)) as conn:
            barrier.wait()
            for n in range(1, per_client + 1):
                started = time.perf_counter()
                result = cancellation.request_cancellation(conn, tenant_id=tenant, job_id=_uuid(f"q{c * STRIDE + n}"),
                                                           request_id=uuid.uuid4(), requested_by="bench")
                latencies.append(time.perf_counter() - started)
                assert result.reply is CancellationReply.RECORDED, result

    return CLIENTS * per_client / _threads(CLIENTS, client)


# --- contended ---------------------------------------------------------------------------------------


def contended_ours(url: str, tenant: uuid.UUID, ops: int, seed: int, tally: dict) -> float:
    """Returns cancels/s; ``tally`` gets the counts of each operation and of deadlocks and Busy answers."""
    per_client = ops // CLIENTS
    lock = threading.Lock()

    def client(c: int, barrier: threading.Barrier) -> None:
        rng = random.Random(seed * 100 + c)
        counts = {"cancel": 0, "claim": 0, "renew": 0, "deadlocks": 0, "busy": 0, "cancel_seconds": []}
        with contextlib.closing(connect(url, Role.APP)) as conn:
            barrier.wait()
            for _ in range(per_client):
                i = rng.randint(1, CONTENDED_JOBS)
                job = _uuid(f"q{i}")
                op = rng.choice(("cancel", "claim", "renew"))
                try:
                    if op == "cancel":
                        started = time.perf_counter()
                        result = cancellation.request_cancellation(conn, tenant_id=tenant, job_id=job,
                                                                   request_id=uuid.uuid4(), requested_by="bench")
                        counts["cancel_seconds"].append(time.perf_counter() - started)
                        counts["busy"] += result.reply is CancellationReply.BUSY
                    elif op == "claim":
                        export.try_claim(conn, job_id=job, checked_version=1, attempt_id=_uuid(f"ao{seed}-{i}"),
                                         worker_id="bench", lease_seconds=60)
                    else:
                        export.renew_lease(conn, job_id=job, attempt_id=_uuid(f"ao{seed}-{i}"), lease_seconds=60)
                except psycopg.errors.DeadlockDetected:
                    counts["deadlocks"] += 1
                counts[op] += 1
        with lock:
            for key, value in counts.items():
                tally[key] = tally.get(key, [] if key == "cancel_seconds" else 0) + value

    elapsed = _threads(CLIENTS, client)
    return tally["cancel"] / elapsed if elapsed else 0.0


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    per_client = sizes.cancel_ops // CLIENTS
    outcome = Outcome()

    # Uncontended.
    url = ctx.fresh_database("cancel", lambda u: None)
    tenant = seed_jobs(url, f"SELECT c * {STRIDE} + n FROM generate_series(0, {CLIENTS - 1}) c,"
                            f" generate_series(1, {per_client}) n")
    settle(url)
    latencies: list[float] = []
    pg_latency: list[float] = []
    uncontended = cancel_script(tenant, contended=False)

    def prepare() -> None:
        requeue_all(url)
        settle(url)

    def ours() -> float:
        return uncontended_ours(url, tenant, per_client, latencies)

    # Request ids are once per tenant: each pgbench round gets its own. (So this pairs by hand.)
    ceilings, ourselves = [], []
    for round_ in range(ctx.repeats):
        for side in (("ceiling", "ours") if round_ % 2 == 0 else ("ours", "ceiling")):
            prepare()
            if side == "ceiling":
                script = uncontended.replace("md5('rq' || :client_id", f"md5('rq{round_}-' || :client_id")
                result = pgbench.run(url, [script], clients=CLIENTS, transactions=per_client, variables={"n": 0})
                pg_latency.append(result.latency_ms)
                ceilings.append(result.tps)
            else:
                ourselves.append(ours())
    log(f"   uncontended: ours {Stat.of(ourselves).median:.0f}/s, pgbench {Stat.of(ceilings).median:.0f}/s")
    ms = [x * 1000 for x in latencies]
    outcome.rows += [
        Row(f"cancels, uncontended, {CLIENTS} clients", "cancels/s", Stat.of(ourselves), Stat.of(ceilings),
            "pgbench, same transaction", at_least(0.5)),
        Row("cancel latency, uncontended, p50 / p99", "ms", Stat.of([percentile(ms, 50), percentile(ms, 99)]),
            Stat.of(pg_latency), "pgbench mean latency", note="range shows p50-p99"),
    ]
    ctx.drop_databases()

    # Contended.
    url = ctx.fresh_database("cancel_contended", lambda u: None)
    tenant = seed_jobs(url, f"SELECT generate_series(1, {CONTENDED_JOBS})")
    settle(url)
    claim = "\\set i random(1, " + str(CONTENDED_JOBS) + ")\n" + pgbench.statement("export_claim", {
        "job_id": "md5('q' || :i)::uuid", "checked_version": "1", "attempt_id": "md5('ap' || :r || '-' || :i)::uuid",
        "worker_id": "'pgbench'", "lease_seconds": "60"}) + "\n"
    renew = "\\set i random(1, " + str(CONTENDED_JOBS) + ")\n" + pgbench.statement("export_lease_renew", {
        "job_id": "md5('q' || :i)::uuid", "attempt_id": "md5('ap' || :r || '-' || :i)::uuid",
        "lease_seconds": "60"}) + "\n"
    tallies: list[dict] = []
    pg_failed: list[int] = []
    ceilings, ourselves = [], []
    for round_ in range(ctx.repeats):
        for side in (("ceiling", "ours") if round_ % 2 == 0 else ("ours", "ceiling")):
            requeue_all(url)
            settle(url)
            if side == "ceiling":
                script = cancel_script(tenant, contended=True).replace(
                    "md5('rq' || :client_id", f"md5('rqc{round_}-' || :client_id")
                result = pgbench.run(url, [script, claim, renew], clients=CLIENTS,
                                     transactions=sizes.contended_ops // CLIENTS, variables={"n": 0, "r": round_})
                pg_failed.append(result.failed)
                ceilings.append(result.script_tps[0])
            else:
                tally: dict = {}
                ourselves.append(contended_ours(url, tenant, sizes.contended_ops, round_, tally))
                tallies.append(tally)
    log(f"   contended: ours {Stat.of(ourselves).median:.0f} cancels/s, pgbench {Stat.of(ceilings).median:.0f}/s")
    deadlocks = sum(t["deadlocks"] for t in tallies)
    cancel_ms = [x * 1000 for t in tallies for x in t["cancel_seconds"]]
    total_ops = sum(t["cancel"] + t["claim"] + t["renew"] for t in tallies)
    outcome.rows += [
        Row(f"cancels, contended with claims and renewals on {CONTENDED_JOBS} jobs", "cancels/s", Stat.of(ourselves),
            Stat.of(ceilings), "pgbench, same mix", at_least(0.5)),
        Row("cancel latency, contended, p50 / p99", "ms",
            Stat.of([percentile(cancel_ms, 50), percentile(cancel_ms, 99)]), note="range shows p50-p99"),
        Row(f"deadlocks in {total_ops:,} mixed operations (ours)", "deadlocks", Stat.of([deadlocks]),
            goal=value_at_most(0, "0")),
        Row(f"deadlocks or other failures in pgbench's {sizes.contended_ops * ctx.repeats:,}", "failed",
            Stat.of([sum(pg_failed)])),
    ]
    outcome.notes += [
        f"Uncontended: {per_client * CLIENTS:,} cancels per round, every job Queued (CanceledWhileQueued).",
        "Contended mix per round: " + ", ".join(
            f"round {i + 1}: {t['cancel']} cancels, {t['claim']} claims, {t['renew']} renewals, {t['busy']} Busy"
            for i, t in enumerate(tallies)) + ".",
    ]
    return outcome


WORKLOAD = Workload("6", "Cancellation", "Cancels per second and their latency, uncontended and contended with "
                    "claims and renewals on the same rows, against pgbench running the same transaction; "
                    "deadlocks over the mixed operations.", run)
