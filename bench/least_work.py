"""Ceiling (a) of the end-to-end figure: the least work that delivers the same files.

One process of ``THREADS`` threads, each with a warm psycopg connection and a warm paramiko session
to the same sshd, each in a closed loop of its own: insert a job row (a transaction), run the export
body (``bench.export_body``: COPY into a local file, a transaction; upload under a temporary name,
no-overwrite rename, stat) and mark the row done (a transaction, conditional on its state). Three
transactions per export and nothing else: no queue, no broker, no lease, no events, no evidence.
It has no load generator: each thread's insert is its creation, counted as its work.
"""

from __future__ import annotations

import uuid

import psycopg

from bench.export_body import Exporter, Target
from bench.spawned import SpawnedSide

THREADS = 4
TABLE = "least_work_exports"
_DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (id uuid PRIMARY KEY, status text NOT NULL,"
        " created_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz)")


def install(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_DDL)


class _LeastWork:
    """One thread's warm connection and session: insert a job, export, mark it done."""

    def __init__(self, target: Target) -> None:
        self.exporter = Exporter(target)

    def one(self) -> bool:
        job = uuid.uuid4()
        self.exporter.conn.execute(f"INSERT INTO {TABLE} (id, status) VALUES (%s, 'running')", (job,))
        self.exporter.export(job.hex)
        done = self.exporter.conn.execute(
            f"UPDATE {TABLE} SET status = 'done', done_at = now() WHERE id = %s AND status = 'running'", (job,))
        if done.rowcount != 1:
            raise RuntimeError(f"job {job} was not running when its export ended")
        return True

    def close(self) -> None:
        self.exporter.close()


def side(target: Target, threads: int = THREADS) -> SpawnedSide:
    """The least-work exporter as a side of the end-to-end workload."""
    return SpawnedSide("least work", _LeastWork, (target,), threads, status="done")
