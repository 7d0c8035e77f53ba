"""Small-export delivery throughput to a real OpenSSH: a new SSH session per delivery against a warm one.

Starts sshd on loopback (Debian's openssh-server, as the tests do; needs root) and delivers --count
small files of --kilobytes each through Destination.deliver, spread over --threads threads, in each mode:

- fresh: a new session per delivery (TCP, key exchange, authentication, the SFTP subsystem);
- warm:  the sessions of a SessionPool, kept open between deliveries and checked before each reuse.

Every delivery still lists its baseline, uploads under a temporary name, renames without overwrite and
reads back a receipt. Reports deliveries per second and the mean latency. Run it from an older tree
(PYTHONPATH=<older checkout> python -m bench.warm_sessions) for the figure before warm sessions and
TCP_NODELAY: a tree without app.delivery.sessions measures the fresh mode only.

    python -m bench.warm_sessions [--count 200] [--kilobytes 5.7] [--threads 1]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from app.delivery.destination import Destination
from app.store.types import ExpectedFile
from tests.fixtures.sftp import running_openssh

try:
    from app.delivery.sessions import SessionPool
except ImportError:   # a tree from before warm sessions: only the fresh mode can be measured
    SessionPool = None  # type: ignore[assignment,misc]


def _run(peer, local: Path, data: bytes, count: int, threads: int, pool) -> tuple[float, float]:
    """Delivers ``count`` copies; returns (seconds in all, mean seconds per delivery)."""
    sha = hashlib.sha256(data).digest()
    latencies: list[float] = []
    lock = threading.Lock()
    destination_id = uuid.uuid4()

    def deliver_some(n: int) -> None:
        destination = Destination(peer.config, environ=peer.environ)
        sessions = pool.for_destination(destination_id) if pool is not None else None
        for _ in range(n):
            expected = ExpectedFile(f"contacts-{uuid.uuid4().hex}.csv", len(data), sha)
            started = time.perf_counter()
            kwargs = {"sessions": sessions} if sessions is not None else {}
            outcome = destination.deliver(local, expected, attempt_id=str(uuid.uuid4()),
                                          record_evidence=lambda evidence: None, **kwargs)
            elapsed = time.perf_counter() - started
            assert outcome.status == "Completed", outcome
            with lock:
                latencies.append(elapsed)

    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    workers = [threading.Thread(target=deliver_some, args=(n,)) for n in per_thread]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started, sum(latencies) / len(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--kilobytes", type=float, default=5.7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_openssh(Path(tmp) / "openssh") as peer:
        local = Path(tmp) / "export.csv"
        local.write_bytes(os.urandom(int(args.kilobytes * 1024)))
        data = local.read_bytes()
        _run(peer, local, data, min(5, args.count), 1, None)   # warm-up: imports, first key exchange
        modes = [("fresh session per delivery", None)]
        if SessionPool is not None:
            modes.append(("warm session (SessionPool)", SessionPool(max_idle=args.threads)))
        print(f"{args.count} deliveries of {args.kilobytes} KiB to OpenSSH on loopback, {args.threads} thread(s):")
        for name, pool in modes:
            total, mean = _run(peer, local, data, args.count, args.threads, pool)
            print(f"  {name:28s} {args.count / total:7.1f} deliveries/s  mean {mean * 1000:6.1f} ms")
            if pool is not None:
                print(f"  {'':28s} sessions opened {pool.opened}, reused {pool.reused}")
                pool.close()


if __name__ == "__main__":
    main()
