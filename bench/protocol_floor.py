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

The statements are the product's own (``app.store``'s thin ``try_*`` functions on a bare connection), and so
are the evidence details they append (``app.delivery.evidence``, ``classifier.outcome_evidence``); nothing
else of the product runs: no Dramatiq, no pools, no lease keeper, no stop watcher, no session slots, no
logs, no metrics. Every write's row count is checked as the product checks it. What ours costs
above this is the system's, not the protocol's: the figure says how much of the gap to a peer the
protocol itself explains.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from pathlib import Path

import redis

from app.delivery.classifier import Completed, outcome_evidence, terminal_write
from app.delivery.evidence import Evidence, EvidenceStage, Listing, Proof, Receipt
from app.store import export, relay
from app.store.database import connect
from app.store.types import ExpectedFile, Role, Status
from app.store.worker import read_job
from bench import system
from bench.export_body import CHUNK, Exporter, Target
from bench.spawned import SpawnedSide

THREADS = 4
LEASE_SECONDS = 60.0
#: The Redis list the relay's hop pushes wake-ups to.
QUEUE = "protocol-floor:wake-ups"
#: Seconds a thread waits for a wake-up before it creates again.
POP_TIMEOUT = 1


class _Floor:
    """One thread's connections (the worker's, the relay's), Redis client and session."""

    def __init__(self, target: Target, broker_url: str, destination: uuid.UUID) -> None:
        self.target = target
        self.tenant = uuid.UUID(target.tenant)
        self.destination = destination
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

    def one(self) -> bool:
        system.create_export(self.conn, self.tenant, self.destination)
        self.relay_hop()
        return self.run_one()

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
        sftp = self.exporter.sftp
        final = f"{self.target.remote_dir}/{job.file_name}"
        try:
            self.exporter.build(local)
            data = local.read_bytes()   # hashed as the builder hashes what it writes
            expected = ExpectedFile(job.file_name, len(data), hashlib.sha256(data).digest(), None, None)
            try:
                sftp.stat(final)
            except FileNotFoundError:
                pass
            else:
                raise RuntimeError(f"{job.file_name} is already on the partner")
            baseline = Evidence(EvidenceStage.BASELINE, Listing(job.file_name, present=False), str(attempt))
            if export.try_authorize_delivery(
                    self.conn, job_id=job.id, tenant_id=job.tenant_id, attempt_id=attempt, expected=expected,
                    replaces_job_id=None, evidence=[baseline.to_detail()], observed_by=observer,
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
        received = Evidence(EvidenceStage.RECEIPT, Listing(job.file_name, present=True, size=seen.st_size,
                                                           mtime=seen.st_mtime), str(attempt))
        outcome = Completed(Receipt(Proof.NAME_AND_SIZE, overwrote=False, evidence=received))
        status, _, detail, _ = terminal_write(outcome)
        if export.try_finish_delivery(self.conn, job_id=job.id, attempt_id=attempt, worker_id=self.worker_id,
                                      outcome=status, detail=detail, observed_by=observer,
                                      evidence=[received.to_detail(), outcome_evidence(outcome, attempt)]) != 1:
            raise RuntimeError(f"job {job_id}'s terminal write matched nothing")
        return True


def _empty_queue(broker_url: str) -> None:
    client = redis.Redis.from_url(broker_url)
    try:
        client.delete(QUEUE)
    finally:
        client.close()


def side(target: Target, broker_url: str, destination: uuid.UUID, threads: int = THREADS) -> SpawnedSide:
    """The protocol with nothing around it, as a side of the end-to-end workload."""
    return SpawnedSide("protocol floor", _Floor, (target, broker_url, destination), threads, status="Completed",
                       prepare=lambda: _empty_queue(broker_url))
