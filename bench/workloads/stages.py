"""Workload 9: the single stages, each against its own limit, in the same run.

- job creation with the outbox NOTIFY against the same creations with its trigger disabled
  (``bench.notify_cost``);
- a stop request while building -> Stopped, through the real runner, against a bare NOTIFY round
  trip (``bench.stop_latency``; requirement: p99 <= 1 s);
- one large export (a million contacts): the builder against psql's ``\\copy``, server-side COPY and a
  bare psycopg loop; its upload on a warm session against OpenSSH ``sftp`` with the handshake left out
  and the same cipher; the export through the running system against the sum of those ceilings, and
  the workers' memory while it runs (``bench.workloads.large_export``; the upload and the export need
  root and sshd).

Claims, the fifth, are workload 7. Each module still runs alone (``python -m bench.<module>``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg

from bench import notify_cost, stop_latency
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, log, percentile, settle, value_at_most
from bench.workloads import large_export

NOTIFY_CLIENTS = 4


def _notify(ctx: Context, outcome: Outcome) -> None:
    url = ctx.fresh_database("stage_notify")
    with psycopg.connect(url, autocommit=True) as owner:
        tenant, destination = tenant_with_destination(owner)

        def creations(enabled: bool) -> float:
            notify_cost.set_trigger(owner, enabled)
            return notify_cost.run(url, NOTIFY_CLIENTS, ctx.sizes.stage_notify_creations, tenant, destination)

        notify_cost.set_trigger(owner, True)
        ceilings, ourselves = ctx.paired(lambda: creations(False), lambda: creations(True),
                                         prepare=lambda: settle(url))
        notify_cost.set_trigger(owner, True)
    outcome.rows.append(Row(f"job creation with the outbox NOTIFY, {NOTIFY_CLIENTS} clients", "creations/s",
                            Stat.of(ourselves), Stat.of(ceilings), "the same without the NOTIFY trigger"))


def _stop(ctx: Context, outcome: Outcome) -> None:
    url = ctx.fresh_database("stage_stop")
    runs = ctx.sizes.stage_stop_runs
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as work:
        ceiling = stop_latency.notify_round_trips(url, runs * 3)
        stops = stop_latency.stop_latencies(url, runs * ctx.repeats, Path(work))
    ms = lambda values: [v * 1000 for v in values]   # noqa: E731
    outcome.rows += [
        Row("stop request while building -> Stopped, p50", "ms", Stat.of([percentile(ms(stops), 50)]),
            Stat.of([percentile(ms(ceiling), 50)]), "NOTIFY round trip, p50"),
        Row("stop request while building -> Stopped, p99", "ms", Stat.of([percentile(ms(stops), 99)]),
            Stat.of([percentile(ms(ceiling), 99)]), "NOTIFY round trip, p99",
            value_at_most(1000, "p99 <= 1 s")),
    ]
    outcome.notes.append(f"Stop latency: {len(stops)} stops through the real runner, lease keeper and watcher.")


def run(ctx: Context) -> Outcome:
    outcome = Outcome()
    for name, stage in (("notify", _notify), ("stop", _stop), ("large export", large_export.run)):
        log(f"   {name}")
        stage(ctx, outcome)
        ctx.drop_databases()
    return outcome


WORKLOAD = Workload("9", "Single stages", "Each stage against its own limit: job creation with and without the "
                    "outbox NOTIFY, stop latency while building, and one large export (a million contacts): the "
                    "builder against psql's `\\copy`, server-side COPY and a bare psycopg loop, its upload on a "
                    "warm session against OpenSSH `sftp` (same cipher, handshake left out), and the export "
                    "through the system against the sum of those, with the workers' memory (claims are "
                    "workload 7).", run)
