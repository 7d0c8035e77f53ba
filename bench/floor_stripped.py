"""Whether the end-to-end goal (ours >= 1.2x Procrastinate) fits inside the protocol at all.

Workload 1 measures the protocol floor (``bench.protocol_floor``: the product's statements and the
delivery's observations, nothing around them) beside Procrastinate; ours cannot beat the floor, since it
runs the floor's work and a system around it. This asks the next question: how much of the floor's
PostgreSQL cost is per-row overhead the schema could shed, rather than the protocol's writes? It runs,
alternating, in one run on one database:

- Procrastinate doing the same export body (the baseline of the goal);
- the protocol floor on the shipped schema;
- the protocol floor with the shipped schema stripped of what costs per row and no statement of the
  floor needs: the attempt events' foreign key to their job (a key-share lock of the job row per event)
  and the five ``export_jobs`` indexes that serve operators' listings (each non-HOT update writes an
  entry into every one). Restored after each of its runs.

and prints each side's median rate and CPU per export, and the stripped floor's ratio to the goal.

    python -m bench.floor_stripped [--rounds 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench import closed_loop, harness, meter, peer_exports, protocol_floor, system
from bench._scratch import base_url
from bench.export_body import Target
from bench.harness import settle
from bench.workloads.end_to_end import BACKLOG

#: What the stripped floor runs without: indexes for listings, and the events' key to their job.
LISTING_INDEXES = ("ix_export_jobs_created", "ix_export_jobs_tenant_created", "ix_export_jobs_status_created",
                   "ix_export_jobs_delivery_key", "ix_export_jobs_tenant_status")
EVENTS_FOREIGN_KEY = "export_attempt_events_job_id_fkey"
#: The goal of issue 16, as a multiple of Procrastinate's rate.
GOAL = 1.2


@contextlib.contextmanager
def stripped(owner_url: str) -> Iterator[None]:
    """The schema without ``LISTING_INDEXES`` and ``EVENTS_FOREIGN_KEY`` while the block runs."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        key = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
                           (EVENTS_FOREIGN_KEY,)).fetchone()
        if key is None:
            raise RuntimeError(f"{EVENTS_FOREIGN_KEY} is not in the schema: update bench.floor_stripped")
        indexes = [conn.execute("SELECT pg_get_indexdef(%s::regclass)", (name,)).fetchone()[0]
                   for name in LISTING_INDEXES]
        conn.execute(f"ALTER TABLE export_attempt_events DROP CONSTRAINT {EVENTS_FOREIGN_KEY}")
        for name in LISTING_INDEXES:
            conn.execute(f"DROP INDEX {name}")
    try:
        yield
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE export_attempt_events ADD CONSTRAINT {EVENTS_FOREIGN_KEY} {key[0]}")
            for definition in indexes:
                conn.execute(definition)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured window")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exports-floor-stripped-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        broker = stack.enter_context(system.private_redis(work / "redis"))
        ctx = harness.Context(sizes=harness.QUICK, base_url=base_url(), broker_url=broker, work_dir=work)
        try:
            rates, costs = _measure(ctx, work, broker, args.rounds, args.seconds)
        finally:
            ctx.drop_databases()
    baseline = statistics.median(rates["Procrastinate"])
    print(f"{args.rounds} rounds of {args.seconds:g} s, alternating; medians")
    for name, runs in rates.items():
        rate = statistics.median(runs)
        print(f"  {name:<24} {rate:7.1f} exports/s  {rate / baseline:5.2f}x Procrastinate  "
              f"CPU per export {costs[name]['cpu_ms']:.2f} ms (PostgreSQL {costs[name]['cpu_postgresql_ms']:.2f},"
              f" Python {costs[name]['cpu_python_ms']:.2f})")
    best = statistics.median(rates["protocol floor, stripped"])
    print(f"  the goal, {GOAL}x Procrastinate: {GOAL * baseline:.1f} exports/s; the stripped floor reaches "
          f"{best / (GOAL * baseline):.2f} of it")


def _measure(ctx: harness.Context, work: Path, broker: str, rounds: int,
             seconds: float) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    with system.partner(work / "partner") as access:
        if not access.openssh:
            raise SystemExit("the floor delivers to OpenSSH sshd, which needs root")
        url = ctx.fresh_database("floor_stripped")
        database = conninfo_to_dict(url)["dbname"]
        owner_url = make_conninfo(ctx.base_url, dbname=database)
        tenant, destination = system.add_tenant(url, access, ctx.sizes.e2e_contacts)
        assert access.key_file is not None
        target = Target(url, str(tenant), access.host, access.port, access.username, access.key_file,
                        access.host_key, access.remote_dir, str(work / "ceiling-work"))
        Path(target.work_dir).mkdir()
        peer_exports.install("procrastinate", url)
        sides: dict[str, Any] = {
            "Procrastinate": peer_exports.procrastinate_side(url, target, BACKLOG),
            "protocol floor": protocol_floor.side(target, broker, destination),
            "protocol floor, stripped": protocol_floor.side(target, broker, destination),
        }
        schema = {"protocol floor, stripped": lambda: stripped(owner_url)}
        servers = {"postgresql": [system.postmaster_pid(url)], "sshd": [access.sshd_pid]}
        gauge = meter.Meter(ctx.base_url, database, servers, access.log, broker)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}

        def alone(name: str, window: float) -> closed_loop.SideRun:
            with schema.get(name, contextlib.nullcontext)():
                settle(url)
                return closed_loop.measure(sides[name], gauge, warmup=ctx.sizes.e2e_warmup_seconds, seconds=window)

        try:
            for name in sides:   # round 0, unmeasured: each side fills its tables before the planner sees them
                alone(name, ctx.sizes.e2e_warmup_seconds)
            for round_ in range(rounds):
                for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
                    run = alone(name, seconds)
                    rates[name].append(run.rate)
                    runs[name].append(run.costs)
                    harness.log(f"   {name}: {run.rate:.1f}/s, {run.costs.get('cpu_ms', float('nan')):.2f} ms CPU")
        finally:
            gauge.close()
    costs = {name: {key: statistics.median(r[key] for r in runs[name])
                    for key in ("cpu_ms", "cpu_postgresql_ms", "cpu_python_ms")} for name in sides}
    return rates, costs


if __name__ == "__main__":
    main()
