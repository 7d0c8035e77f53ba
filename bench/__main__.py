"""`make bench` / `make bench-full`: every workload against its ceiling, in one run.

    python -m bench [--full] [--only 1,3,7] [--repeats N] [--no-docs] [--results FILE] [--profile DIR]

Writes bench/results/<date>.json and regenerates docs/benchmarks.md (with charts under
docs/benchmarks/). Uses EXPORTS_BENCH_DATABASE_URL (default: PostgreSQL at 127.0.0.1:5432; scratch
databases named exports_bench_*, dropped after each workload) and EXPORTS_BENCH_BROKER_URL (default: a
redis-server of the bench's own on a free loopback port, started and stopped by the run, since the
machine's shared Redis may have other workers on it; without redis-server, 127.0.0.1:6379 database 13).
The bench empties the broker's database between runs. Each module in bench/ can still be run
alone: python -m bench.claim_throughput, bench.notify_cost, bench.webhook_cost, bench.stop_latency, bench.build_export,
bench.upload_throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import _scratch, harness, report, system
from bench.workloads import ALL

RESULTS = Path(__file__).resolve().parent / "results"
#: Without a redis-server binary to start a private one: the machine's Redis, a database of the bench's own.
SHARED_BROKER_URL = "redis://127.0.0.1:6379/13"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the issue's sizes and durations (about an hour)")
    parser.add_argument("--only", help="comma-separated workload keys, e.g. 1,3,7 (default: all)")
    parser.add_argument("--repeats", type=int, help="rounds per workload (default 3)")
    parser.add_argument("--no-docs", action="store_true", help="write the results file only")
    parser.add_argument("--results", type=Path, metavar="FILE",
                        help="write the results to FILE instead of bench/results/<date>.json (a trial run that "
                             "must not replace the day's results)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run each workload under pyinstrument and write its profile to DIR")
    args = parser.parse_args()

    sizes = harness.FULL if args.full else harness.QUICK
    if args.repeats:
        if args.repeats < 1:
            print("--repeats must be at least 1", file=sys.stderr)
            return 2
        sizes = dataclasses.replace(sizes, repeats=args.repeats)
    chosen = ALL
    if args.only:
        keys = {k.strip() for k in args.only.split(",") if k.strip()}
        unknown = keys - {w.key for w in ALL}
        if unknown:
            print(f"unknown workload(s) {', '.join(sorted(unknown))}; known: {', '.join(w.key for w in ALL)}",
                  file=sys.stderr)
            return 2
        chosen = [w for w in ALL if w.key in keys]

    started = time.perf_counter()
    stamp = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="exports-bench-") as tmp, contextlib.ExitStack() as stack:
        broker_url = os.environ.get("EXPORTS_BENCH_BROKER_URL")
        if not broker_url:
            broker_url = (stack.enter_context(system.private_redis(Path(tmp) / "redis"))
                          if system.REDIS_SERVER.exists() else SHARED_BROKER_URL)
        ctx = harness.Context(sizes=sizes, base_url=_scratch.base_url(), broker_url=broker_url, work_dir=Path(tmp))
        harness.log(f"broker: {broker_url}")
        reports = harness.run_all(ctx, chosen, profile_dir=args.profile)
    results = {
        "file": f"{stamp:%Y-%m-%d}.json",
        "mode": sizes.name,
        "started": f"{stamp:%Y-%m-%d %H:%M} UTC",
        "total_seconds": time.perf_counter() - started,
        "sizes": dataclasses.asdict(sizes),
        "machine": harness.machine(),
        "workloads": [r.as_json() for r in reports],
    }
    path = args.results or RESULTS / results["file"]
    path.parent.mkdir(parents=True, exist_ok=True)
    results["file"] = path.name
    path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"results: {path}")
    if not args.no_docs:
        print(f"docs:    {report.write(results)}")
    failed = [r.key for r in reports if r.error]
    if failed:
        print(f"workloads that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
