"""Stop latency: a stop request committed while an export is building must end the attempt as Stopped
within 1 s at p99.

Each run claims a fresh job through the real runner (lease keeper, stop watcher on LISTEN with its
polling fallback at the production interval, the contacts builder), holds the build at a checkpoint
that ends only when the attempt's stop signal is set, as a builder between two blocks does, records a
stop request through the real cancellation path, and times from just before that request to the
runner's return after its Stopped write. The ceiling, measured in the same run on the same server, is
a bare NOTIFY round trip between two connections: no stop path can beat it.

    python -m bench.stop_latency [--runs 50]

Uses EXPORTS_BENCH_DATABASE_URL (default: the local PostgreSQL at 127.0.0.1:5432, or an embedded one if
that is not reachable) and a scratch database there, dropped at the end. Exits 1 when p99 > 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

from app.actors.builder import ContactsBuilder
from app.actors.lease import Leases, new_scheduler
from app.actors.policy import ExportPolicy
from app.actors.runner import ExportRunner, RunOutcome
from app.actors.stop import StopSignal
from app.actors.watcher import StopWatcher
from app.config import Settings
from app.store import cancellation
from app.store.database import Database, connect
from app.store.types import Role
from bench import system
from bench._scratch import base_url, create, drop, tenant_with_destination

#: The requirement, in seconds.
P99_LIMIT_SECONDS = 1.0


def server_url() -> tuple[str, object | None]:
    url = base_url()
    try:
        psycopg.connect(url, connect_timeout=3).close()
        return url, None
    except psycopg.OperationalError:
        import pgserver

        server = pgserver.get_server(tempfile.mkdtemp(prefix="exports-bench-pg-"), cleanup_mode="stop")
        return server.get_uri(), server


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered))) - 1))]


def notify_round_trips(url: str, runs: int) -> list[float]:
    listener = connect(url, Role.APP)
    sender = connect(url, Role.APP)
    try:
        listener.execute("LISTEN bench_ceiling")
        samples = []
        for i in range(runs):
            started = time.perf_counter()
            sender.execute("SELECT pg_notify('bench_ceiling', %s)", (str(i),))
            for _ in listener.notifies(timeout=5, stop_after=1):
                pass
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        listener.close()
        sender.close()


def host_key_line() -> str:
    """A well-formed pinned key; the bench never connects to it (the build is stopped first)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"127.0.0.1 {public}"


class HoldUntilStopped:
    """The build's checkpoint: tells the bench the build is under way, then waits for the stop."""

    def __init__(self) -> None:
        self.building = threading.Event()

    def __call__(self, stop: StopSignal) -> None:
        self.building.set()
        if not stop.wait(30):
            raise RuntimeError("the stop never reached the build")


def stop_latencies(url: str, runs: int, work_dir: Path) -> list[float]:
    settings = Settings()
    conn = connect(url, Role.APP)
    tenant_id, destination_id = tenant_with_destination(conn, host_key=host_key_line())
    conn.execute("INSERT INTO contacts (tenant_id, email, full_name, consent)"
                 " SELECT %s, 'c' || i || '@example.com', 'C ' || i, true FROM generate_series(1, 1000) i",
                 (tenant_id,))
    scheduler = new_scheduler()
    watcher = StopWatcher(url, poll_seconds=settings.stop_poll_seconds)
    samples = []
    with Database(url, Role.APP) as db:
        try:
            for _ in range(runs):
                hold = HoldUntilStopped()
                runner = ExportRunner(
                    db=db, lease_seconds=settings.lease_seconds, policy=ExportPolicy(),
                    builder=ContactsBuilder(url, work_dir, checkpoint=hold),
                    leases=Leases(url, lease_seconds=settings.lease_seconds, renew_seconds=settings.renew_seconds,
                                  scheduler=scheduler),
                    watcher=watcher)
                job_id = system.create_export(conn, tenant_id, destination_id)
                results = []
                # Bound now: a run that outlives the join must not report into the next iteration's list.
                thread = threading.Thread(target=lambda runner=runner, job_id=job_id, results=results:
                                          results.append(runner.run(job_id)))
                thread.start()
                if not hold.building.wait(30):
                    raise RuntimeError("the build never started")
                started = time.perf_counter()
                cancellation.request_cancellation(conn, tenant_id=tenant_id, job_id=job_id,
                                                  request_id=uuid.uuid4(), requested_by="bench")
                thread.join(30)
                elapsed = time.perf_counter() - started
                if not results or results[0].outcome is not RunOutcome.STOPPED:
                    raise RuntimeError(f"run ended {results[0].outcome if results else 'never'}, not Stopped")
                samples.append(elapsed)
        finally:
            watcher.close()
            scheduler.shutdown(wait=False)
            conn.close()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stop_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()

    url, server = server_url()
    name = f"exports_bench_stop_{uuid.uuid4().hex[:8]}"
    scratch = create(url, name)
    try:
        with tempfile.TemporaryDirectory(prefix="exports-bench-work-") as work_dir:
            ceiling = notify_round_trips(scratch, args.runs)
            stops = stop_latencies(scratch, args.runs, Path(work_dir))
    finally:
        drop(url, name)
        if server is not None:
            server.cleanup()

    ms = lambda seconds: f"{seconds * 1000:8.1f} ms"   # noqa: E731
    p50, p99 = percentile(stops, 50), percentile(stops, 99)
    c50, c99 = percentile(ceiling, 50), percentile(ceiling, 99)
    print(f"stop request -> Stopped ({len(stops)} runs): p50 {ms(p50)}  p99 {ms(p99)}  max {ms(max(stops))}")
    print(f"NOTIFY round trip ceiling  ({len(ceiling)} runs): p50 {ms(c50)}  p99 {ms(c99)}")
    print(f"ratio p50 {p50 / c50:6.1f}x   requirement p99 <= {P99_LIMIT_SECONDS:.0f} s: "
          f"{'met' if p99 <= P99_LIMIT_SECONDS else 'NOT MET'}  (mean {statistics.mean(stops) * 1000:.1f} ms)")
    return 0 if p99 <= P99_LIMIT_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
