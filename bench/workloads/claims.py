"""Workload 7: claims at 1, 4 and 8 workers, with synchronous_commit on and off.

``bench.claim_throughput`` at each concurrency: every client claims Queued jobs of its own through
``app.store.export.try_claim``; the ceiling is pgbench running the same ``export_claim`` statement on
jobs seeded the same way, with the same clients and claims. ``synchronous_commit=off`` is set on both
sides' connections (``-c synchronous_commit=off``), which shows how much of a claim is the WAL flush.
"""

from __future__ import annotations

from itertools import count

from bench import claim_throughput
from bench.harness import Context, Outcome, Row, Stat, Workload, log, settle

CONCURRENCY = (1, 4, 8)


def run(ctx: Context) -> Outcome:
    url = ctx.fresh_database("claims")
    total = ctx.sizes.claims_per_run
    tags = count()
    outcome = Outcome()
    points: dict[str, list[tuple[float, float]]] = {}
    for sync in ("on", "off"):
        options = "" if sync == "on" else "-c synchronous_commit=off"
        for clients in CONCURRENCY:
            ceilings, ourselves = _paired_claims(ctx, url, clients, max(1, total // clients), options, tags)
            log(f"   {clients} clients, synchronous_commit={sync}: {Stat.of(ourselves).median:.0f}/s vs "
                f"{Stat.of(ceilings).median:.0f}/s")
            outcome.rows.append(Row(f"claims, {clients} worker{'s' * (clients > 1)}, synchronous_commit={sync}",
                                    "claims/s", Stat.of(ourselves), Stat.of(ceilings), "pgbench, same statement"))
            points.setdefault(f"ours, sync {sync}", []).append((clients, Stat.of(ourselves).median))
            points.setdefault(f"pgbench, sync {sync}", []).append((clients, Stat.of(ceilings).median))
    outcome.notes.append(f"{total:,} claims per run, split between the clients; a fresh set of Queued jobs for "
                         "every run; both sides as exports_app, statements prepared.")
    outcome.series["claims/s vs workers"] = points
    return outcome


def _paired_claims(ctx: Context, url: str, clients: int, per_client: int, options: str,
                   tags: count[int]) -> tuple[list[float], list[float]]:
    """Both sides at one concurrency, each run on a fresh set of jobs under a tag of its own."""
    tag = {"value": ""}

    def prepare() -> None:
        tag["value"] = f"r{next(tags)}"
        claim_throughput.seed(url, clients, per_client, tag["value"])
        settle(url)

    return ctx.paired(lambda: claim_throughput.run_pgbench(url, clients, per_client, tag["value"], options),
                      lambda: claim_throughput.run_store(url, clients, per_client, tag["value"], options),
                      prepare=prepare)


WORKLOAD = Workload("7", "Claims", "Claims per second through `app.store.export.try_claim` at 1, 4 and 8 "
                    "workers with synchronous_commit on and off, against pgbench running the same claim "
                    "statement with the same clients (the first of the five original benchmarks, extended).", run)
