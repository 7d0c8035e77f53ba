"""Workload 9: the single stages the first benchmarks measured, folded into the same run.

- job creation with the outbox NOTIFY against the same creations with its trigger disabled
  (``bench.notify_cost``);
- a stop request while building -> Stopped, through the real runner, against a bare NOTIFY round
  trip (``bench.stop_latency``; requirement: p99 <= 1 s);
- the builder against psql's ``\\copy`` of the same query, at two sizes, and its peak Python memory
  (``bench.build_export``);
- ``Destination.deliver`` to OpenSSH against the OpenSSH ``sftp`` client putting the same file
  (``bench.upload_throughput``; needs root and sshd).

Claims, the fifth, are workload 7. Each module still runs alone (``python -m bench.<module>``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from uuid import UUID

import psycopg

from bench import build_export, notify_cost, stop_latency, upload_throughput
from bench._scratch import tenant_with_destination
from bench.harness import Context, Outcome, Row, Stat, Workload, log, percentile, settle, value_at_most
from bench.system import SSHD

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


def _build(ctx: Context, outcome: Outcome) -> None:
    url = ctx.fresh_database("stage_build")
    with psycopg.connect(url, autocommit=True) as owner, tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp:
        work = Path(tmp)
        for count in (ctx.sizes.stage_contacts, ctx.sizes.stage_contacts * 10):
            tenant = build_export.seed(owner, count)
            settle(url)
            build_export.build(url, work, tenant, trace=False)   # warm-up
            ceilings, ourselves = _paired_build(ctx, url, work, tenant, count)
            peak = build_export.build(url, work, tenant, trace=True)[2]
            outcome.rows += [
                Row(f"builder, {count:,} contacts", "contacts/s", Stat.of(ourselves), Stat.of(ceilings),
                    "psql \\copy, same query"),
                Row(f"builder peak Python memory, {count:,} contacts", "KiB", Stat.of([peak / 1024])),
            ]


def _paired_build(ctx: Context, url: str, work: Path, tenant: UUID, count: int) -> tuple[list[float], list[float]]:
    """Contacts per second of psql's \\copy and of our builder, on the same tenant."""
    return ctx.paired(lambda: count / build_export.psql_copy(url, work, tenant),
                      lambda: count / build_export.build(url, work, tenant, trace=False)[0])


def _upload(ctx: Context, outcome: Outcome) -> None:
    if os.geteuid() != 0 or not SSHD.exists():
        outcome.notes.append("Upload not measured: it starts OpenSSH sshd on loopback, which needs root and "
                             "/usr/sbin/sshd (Debian openssh-server).")
        return
    from tests.fixtures.sftp import running_openssh

    mib = ctx.sizes.stage_upload_mib
    with tempfile.TemporaryDirectory(dir=ctx.work_dir) as tmp, running_openssh(Path(tmp) / "openssh") as peer:
        local = Path(tmp) / "export.csv"
        local.write_bytes(os.urandom(mib * 1024 * 1024))
        upload_throughput.deliver_once(peer, local)   # warm-up
        ceilings, ourselves = ctx.paired(lambda: mib / upload_throughput.sftp_put_once(peer, local, Path(tmp)),
                                         lambda: mib / upload_throughput.deliver_once(peer, local))
    outcome.rows.append(Row(f"Destination.deliver of {mib} MiB to OpenSSH", "MiB/s", Stat.of(ourselves),
                            Stat.of(ceilings), "OpenSSH sftp put, same file"))


def run(ctx: Context) -> Outcome:
    outcome = Outcome()
    for stage in (_notify, _stop, _build, _upload):
        log(f"   {stage.__name__.strip('_')}")
        stage(ctx, outcome)
        ctx.drop_databases()
    return outcome


WORKLOAD = Workload("9", "Single stages", "The first benchmarks, each against its own ceiling: job creation "
                    "with and without the outbox NOTIFY, stop latency while building, the builder against psql's "
                    "`\\copy`, and delivery against the OpenSSH `sftp` client (claims are workload 7).", run)
