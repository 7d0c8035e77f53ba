"""Ceiling (a) of the end-to-end figure: the least work that delivers the same files.

One process of ``THREADS`` threads, each with a warm psycopg connection and a warm paramiko session
to the same sshd, each in a closed loop of its own: insert a job row (a transaction), run the export
body (``bench.export_body``: COPY into a local file, a transaction; upload under a temporary name,
no-overwrite rename, stat) and mark the row done (a transaction, conditional on its state). Three
transactions per export and nothing else: no queue, no broker, no lease, no events, no evidence.
It has no load generator: each thread's insert is its creation, counted as its work.
"""

from __future__ import annotations

import sys
import threading
import traceback
import uuid
from multiprocessing import get_context
from typing import Any

import psycopg

from bench.export_body import Exporter, Target

THREADS = 4
STOP_TIMEOUT = 30.0
TABLE = "least_work_exports"
_DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (id uuid PRIMARY KEY, status text NOT NULL,"
        " created_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz)")


def install(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_DDL)


def _loop(target: Target, counter: Any, stop: Any, failed: Any) -> None:
    exporter = None
    try:
        exporter = Exporter(target)
        while not stop.is_set():
            job = uuid.uuid4()
            exporter.conn.execute(f"INSERT INTO {TABLE} (id, status) VALUES (%s, 'running')", (job,))
            exporter.export(job.hex)
            done = exporter.conn.execute(
                f"UPDATE {TABLE} SET status = 'done', done_at = now() WHERE id = %s AND status = 'running'", (job,))
            if done.rowcount != 1:
                raise RuntimeError(f"job {job} was not running when its export ended")
            with counter.get_lock():
                counter.value += 1
    except BaseException:
        failed.value = 1
        traceback.print_exc(file=sys.stderr)
    finally:
        if exporter is not None:
            exporter.close()


def main(target: dict[str, Any], threads: int, counter: Any, stop: Any, failed: Any) -> None:
    """The spawned process: ``threads`` loops until ``stop`` is set."""
    workers = [threading.Thread(target=_loop, args=(Target(**target), counter, stop, failed), name=f"least-{i}")
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


class LeastWorkSide:
    """The least-work exporter as a side of the end-to-end workload."""

    name = "least work"

    def __init__(self, target: Target, threads: int = THREADS) -> None:
        self.target = target
        self.threads = threads
        self._mp = get_context("spawn")
        self._process: Any = None

    def start(self) -> None:
        self.counter = self._mp.Value("q", 0)
        self.failed = self._mp.Value("b", 0)
        self.stop_event = self._mp.Event()
        self._process = self._mp.Process(target=main, name="least-work", daemon=True, args=(
            self.target.as_dict(), self.threads, self.counter, self.stop_event, self.failed))
        self._process.start()

    def completed(self) -> int:
        return int(self.counter.value)

    def generator_transactions(self) -> int:
        return 0

    def python_pids(self) -> list[int]:
        return [self._process.pid] if self._process is not None else []

    def mark(self) -> None:
        pass

    def check(self) -> None:
        if self.failed.value:
            raise RuntimeError("a least-work thread failed (its traceback is on stderr)")
        if self._process is not None and not self._process.is_alive():
            raise RuntimeError(f"the least-work process exited with {self._process.exitcode}")

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        self._process.join(STOP_TIMEOUT)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None
        if self.failed.value:
            raise RuntimeError("a least-work thread failed (its traceback is on stderr)")
        return {"done": self.completed()}
