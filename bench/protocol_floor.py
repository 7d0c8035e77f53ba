"""Ceiling (b) of the end-to-end figure: the reference's protocol and nothing else.

The least-work exporter (``bench.least_work``) delivers the same files with no guarantee; this one keeps
the protocol's writes and observations and drops only the system around them. One process of
``THREADS`` threads, each with warm connections (the worker's, the relay's), a warm Redis client and a
warm session, in a closed loop of its own:

1. create: the product's ``export_create`` (the job, its key, the outbox row and the event; a commit);
2. the relay's hop: the due outbox rows claimed, pushed to a Redis list, marked published (a commit);
3. a wake-up popped from that list (any thread's), and for its job: the product's ``worker_read_job``,
   cutoff 1 (``export_claim``, a commit), the build (COPY into a local file, hashed), the baseline (a
   stat of the final name), cutoff 2 with the baseline (``export_authorize_delivery``, a commit), the
   upload under a temporary name, the no-overwrite rename, the receipt (a stat), and the terminal write
   with the receipt and the outcome (``export_finish_delivery``, a commit).

The statements are the product's own (``app.store``'s thin ``try_*`` functions on a bare connection);
nothing else of the product runs: no Dramatiq, no pools, no lease keeper, no stop watcher, no session
slots, no logs, no metrics. Every write's row count is checked as the product checks it. What ours costs
above this is the system's, not the protocol's: the figure says how much of the gap to a peer the
protocol itself explains.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import traceback
import uuid
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import redis

from app.store import export, relay
from app.store.database import connect
from app.store.types import ExpectedFile, Role, Status
from app.store.worker import read_job
from bench.export_body import CHUNK, Exporter, Target

THREADS = 4
STOP_TIMEOUT = 30.0
LEASE_SECONDS = 60.0
#: The Redis list the relay's hop pushes wake-ups to.
QUEUE = "protocol-floor:wake-ups"
#: Seconds a thread waits for a wake-up before it creates again.
POP_TIMEOUT = 1


def _observed(**fields: Any) -> str:
    """An evidence detail of the product's shape and size (``app.delivery.evidence``)."""
    return json.dumps({**fields, "observed_at": datetime.now(UTC).isoformat()}, sort_keys=True,
                      separators=(",", ":"))


class _Loop:
    def __init__(self, target: Target, broker_url: str, destination: str) -> None:
        self.target = target
        self.tenant = uuid.UUID(target.tenant)
        self.destination = uuid.UUID(destination)
        self.conn = connect(target.url, Role.APP, application_name="protocol-floor")
        #: The relay's hop runs as the relay does, under the dispatcher's role.
        self.relay_conn = connect(target.url, Role.DISPATCHER, application_name="protocol-floor-relay")
        self.redis = redis.Redis.from_url(broker_url)
        self.exporter = Exporter(target)
        self.worker_id = f"protocol-floor:{threading.get_native_id()}"

    def close(self) -> None:
        self.exporter.close()
        self.redis.close()
        self.relay_conn.close()
        self.conn.close()

    def create(self) -> None:
        job = uuid.uuid4()
        result = export.create(self.conn, job_id=job, tenant_id=self.tenant, destination_id=self.destination,
                               delivery_key=job.hex, created_by="bench")
        if result is not export.CreateResult.CREATED:
            raise RuntimeError(f"export.create answered {result}")

    def relay_hop(self) -> None:
        with self.relay_conn.transaction():
            batch = relay.claim_batch(self.relay_conn, batch_size=100)
            if not batch.rows:
                return
            self.redis.lpush(QUEUE, *[str(m.job_id) for m in batch.rows])
            marked = relay.mark_published(self.relay_conn, message_ids=[m.message_id for m in batch.rows])
            if marked != len(batch.rows):
                raise RuntimeError(f"marked {marked} of {len(batch.rows)} outbox rows published")

    def run_one(self) -> bool:
        popped = self.redis.brpop([QUEUE], timeout=POP_TIMEOUT)
        if popped is None:
            return False
        job_id = uuid.UUID(popped[1].decode())
        job = read_job(self.conn, job_id)
        if job is None or job.status is not Status.QUEUED:
            raise RuntimeError(f"job {job_id} is not Queued when its wake-up is popped")
        attempt = uuid.uuid4()
        observer = f"{self.worker_id}/{attempt}"
        if export.try_claim(self.conn, job_id=job.id, checked_version=job.version, attempt_id=attempt,
                            worker_id=self.worker_id, lease_seconds=LEASE_SECONDS) != 1:
            raise RuntimeError(f"job {job_id} was not claimed")
        local = Path(self.target.work_dir) / f"{attempt}.csv"
        try:
            self.exporter.build(local)
            data = local.read_bytes()   # hashed as the builder hashes what it writes
            expected = ExpectedFile(job.file_name, len(data), hashlib.sha256(data).digest(), None, None)
            sftp = self.exporter.sftp
            final = f"{self.target.remote_dir}/{job.file_name}"
            try:
                sftp.stat(final)
                raise RuntimeError(f"{job.file_name} is already on the partner")
            except FileNotFoundError:
                pass
            baseline = _observed(ack=None, attempt_id=str(attempt), final_name=job.file_name, hash_source=None,
                                 mtime=None, present=False, sha256=None, size=None, stage="baseline")
            if export.try_authorize_delivery(
                    self.conn, job_id=job.id, tenant_id=job.tenant_id, attempt_id=attempt, expected=expected,
                    replaces_job_id=None, evidence=[baseline], observed_by=observer,
                    profile_version=job.profile_version) != 1:
                raise RuntimeError(f"job {job_id} was not authorized")
            temp = f"{self.target.remote_dir}/.{job.file_name}.{attempt}.part"
            with local.open("rb") as source, sftp.open(temp, "wb") as remote:
                remote.set_pipelined(True)
                while chunk := source.read(CHUNK):
                    remote.write(chunk)
            sftp.rename(temp, final)
            seen = sftp.stat(final)
            if seen.st_size != expected.size:
                raise RuntimeError(f"{job.file_name} has another size on the partner")
        finally:
            local.unlink(missing_ok=True)
        receipt = dict(ack=None, attempt_id=str(attempt), final_name=job.file_name, hash_source=None,
                       mtime=seen.st_mtime, present=True, sha256=None, size=seen.st_size, stage="receipt")
        evidence = [_observed(**receipt), _observed(attempt_id=str(attempt), outcome="Completed", stage="outcome",
                                                    receipt={**receipt, "overwrote": False, "proof": "name-and-size"})]
        if export.try_finish_delivery(self.conn, job_id=job.id, attempt_id=attempt, worker_id=self.worker_id,
                                      outcome=Status.COMPLETED, detail="Completed: proof=name-and-size",
                                      evidence=evidence, observed_by=observer) != 1:
            raise RuntimeError(f"job {job_id}'s terminal write matched nothing")
        return True


def _loop(target: Target, broker_url: str, destination: str, counter: Any, stop: Any, failed: Any) -> None:
    loop = None
    try:
        loop = _Loop(target, broker_url, destination)
        while not stop.is_set():
            loop.create()
            loop.relay_hop()
            if loop.run_one():
                with counter.get_lock():
                    counter.value += 1
    except BaseException:
        failed.value = 1
        traceback.print_exc(file=sys.stderr)
    finally:
        if loop is not None:
            loop.close()


def main(target: dict[str, Any], broker_url: str, destination: str, threads: int, counter: Any, stop: Any,
         failed: Any) -> None:
    """The spawned process: ``threads`` loops until ``stop`` is set."""
    workers = [threading.Thread(target=_loop, name=f"floor-{i}",
                                args=(Target(**target), broker_url, destination, counter, stop, failed))
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


class ProtocolFloorSide:
    """The protocol with nothing around it, as a side of the end-to-end workload."""

    name = "protocol floor"

    def __init__(self, target: Target, broker_url: str, destination: uuid.UUID, threads: int = THREADS) -> None:
        self.target = target
        self.broker_url = broker_url
        self.destination = str(destination)
        self.threads = threads
        self._mp = get_context("spawn")
        self._process: Any = None

    def start(self) -> None:
        client = redis.Redis.from_url(self.broker_url)
        try:
            client.delete(QUEUE)
        finally:
            client.close()
        self.counter = self._mp.Value("q", 0)
        self.failed = self._mp.Value("b", 0)
        self.stop_event = self._mp.Event()
        self._process = self._mp.Process(target=main, name="protocol-floor", daemon=True, args=(
            self.target.as_dict(), self.broker_url, self.destination, self.threads, self.counter,
            self.stop_event, self.failed))
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
            raise RuntimeError("a protocol-floor thread failed (its traceback is on stderr)")
        if self._process is not None and not self._process.is_alive():
            raise RuntimeError(f"the protocol-floor process exited with {self._process.exitcode}")

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        self._process.join(STOP_TIMEOUT)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None
        if self.failed.value:
            raise RuntimeError("a protocol-floor thread failed (its traceback is on stderr)")
        return {"Completed": self.completed()}
