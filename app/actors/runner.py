"""The export runner: the reference's ExportRunner, top to bottom.

hint (re-read the row) -> policy -> claim (cutoff 1) -> lease keeper and stop watcher -> build ->
cutoff 2 (one retry after an on-demand renewal) -> deliver -> evidence -> terminal write.

Every write goes through ``app.store.export`` and is conditional; those after the claim also require
this attempt, so an attempt that lost ownership changes nothing, and its catch blocks record nothing.
Stop requests are obeyed until cutoff 2 and recorded (TooLate, by the cancellation path) after it; a
lost lease stops preparation but never an upload.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable
from uuid import UUID

from app import logs, metrics
from app.actors.builder import BuildFailed, BuildStopped, BuiltFile, ContactsBuilder
from app.delivery.classifier import Completed, DeliveryOutcome, Failed, Stage, Unknown, classify
from app.delivery.config import DestinationConfig
from app.delivery.destination import Destination
from app.delivery.evidence import Evidence
from app.actors.lease import LeaseKeeper, Leases
from app.actors.policy import Decision, ExportPolicy
from app.actors.stop import StopReason, StopSignal
from app.actors.watcher import StopWatcher
from app.store import export
from app.store.worker import JobView, read_job, read_original_expected
from app.store.database import Database
from app.store.types import (
    AuthorizationResult,
    ClaimResult,
    ExpectedFile,
    FailureCode,
    RenewResult,
    Status,
    WriteResult,
)

log = logs.get(__name__)

_CLAIM_LABEL = {ClaimResult.CLAIMED: "won", ClaimResult.LOST: "lost", ClaimResult.UNKNOWN: "unknown"}


class RunOutcome(enum.Enum):
    """Where a run ended. Only CLAIM_UNKNOWN leaves the message unsettled."""

    NOT_QUEUED = "NotQueued"            # the hint was stale: canceled, claimed, ended, or not found
    REJECTED = "Rejected"               # policy refused this version (the write may have matched nothing)
    NOT_CLAIMED = "NotClaimed"          # cutoff 1 lost: another claim, a cancel or an edit won
    CLAIM_UNKNOWN = "ClaimUnknown"      # the claim and its re-read both failed
    STOPPED = "Stopped"                 # a recorded stop request ended the attempt before cutoff 2
    FAILED = "Failed"                   # the build failed, or the replacement's original was completed
    GAVE_UP = "GaveUp"                  # ownership lost or unknown before cutoff 2: wrote nothing
    DELIVERED = "Delivered"             # past cutoff 2: the delivery ran and its outcome was written (or not)


@dataclass(frozen=True)
class RunResult:
    outcome: RunOutcome
    attempt_id: UUID | None = None
    #: The attempt's terminal write, when it made one.
    write: WriteResult | None = None
    #: For DELIVERED: Completed, Failed or OutcomeUnknown, as the destination reported it.
    delivery: Status | None = None


@dataclass(frozen=True)
class Prepared:
    """What an attempt past cutoff 2 delivers: the built file, what cutoff 2 recorded, and for a
    replacement the original's expected file (None if the original never reached cutoff 2)."""

    built: BuiltFile
    expected: ExpectedFile
    original: ExpectedFile | None


def worker_identity() -> str:
    """hostname:pid:thread, so an operator can find the process and thread behind an attempt."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


DestinationFactory = Callable[[DestinationConfig], Destination]


class ExportRunner:
    def __init__(
        self, *, db: Database, lease_seconds: float, policy: ExportPolicy, builder: ContactsBuilder,
        leases: Leases, watcher: StopWatcher, destination_for: DestinationFactory = Destination,
        worker_id: Callable[[], str] = worker_identity,
    ) -> None:
        self.db = db
        self.lease_seconds = lease_seconds
        self.policy = policy
        self.builder = builder
        self.leases = leases
        self.watcher = watcher
        self.destination_for = destination_for
        self.worker_id = worker_id
        self._active: set[StopSignal] = set()
        self._active_lock = threading.Lock()

    def shutdown(self) -> int:
        """The worker is stopping: ends every attempt still preparing, writing nothing (the job stays
        Running and recovery takes it over when its lease expires). Uploads are not interrupted: past
        cutoff 2 the signal is ignored. Returns how many attempts were signalled."""
        with self._active_lock:
            active = list(self._active)
        return sum(1 for stop in active if stop.set(StopReason.SHUTDOWN))

    def run(self, job_id: UUID) -> RunResult:
        # The message is only a hint. Everything below starts from the row.
        with self.db.connection() as conn:
            job = read_job(conn, job_id)
            if job is None or job.status is not Status.QUEUED:
                return RunResult(RunOutcome.NOT_QUEUED)
            decision = self.policy.evaluate(conn, job)
            if not decision.allowed:
                # Queued -> Rejected, this version only: after an edit this matches nothing, and the
                # edit's own wake-up brings the job back for a fresh evaluation.
                rejected = export.reject(conn, job_id=job.id, checked_version=job.version)
                assert decision.refusal is not None
                log.info("runner.rejected", job_id=job.id, version=job.version, refusal=decision.refusal.value,
                         written=rejected)
                return RunResult(RunOutcome.REJECTED)

        # Cutoff 1.
        attempt_id = uuid.uuid4()
        worker_id = self.worker_id()
        claim = export.claim(self.db, job_id=job.id, checked_version=job.version, attempt_id=attempt_id,
                           worker_id=worker_id, lease_seconds=self.lease_seconds)
        metrics.worker().claims.labels(_CLAIM_LABEL[claim]).inc()
        if claim is ClaimResult.UNKNOWN:
            return RunResult(RunOutcome.CLAIM_UNKNOWN, attempt_id)   # leave the message unsettled
        if claim is ClaimResult.LOST:
            return RunResult(RunOutcome.NOT_CLAIMED)
        log.info("runner.claimed", job_id=job.id, attempt_id=attempt_id, worker_id=worker_id)

        # From the confirmed claim to the attempt's last write: one stop signal, one lease keeper.
        stop = StopSignal()
        with self._active_lock:
            self._active.add(stop)
        keeper = self.leases.keep(job.id, attempt_id, stop)
        watch = self.watcher.watch(job.id, attempt_id, stop)
        try:
            prepared = self._prepare(job, decision, attempt_id, worker_id, keeper, stop)
            watch.close()   # past cutoff 2 a stop request is recorded (TooLate), not obeyed
            if isinstance(prepared, RunResult):
                return prepared
            return self._deliver(job, decision, attempt_id, worker_id, prepared, keeper)
        finally:
            watch.close()
            keeper.finish()
            with self._active_lock:
                self._active.discard(stop)

    # --- before cutoff 2: reversible ------------------------------------------------------------------

    def _prepare(self, job: JobView, decision: Decision, attempt_id: UUID, worker_id: str,
                 keeper: LeaseKeeper, stop: StopSignal) -> Prepared | RunResult:
        """The file and what cutoff 2 recorded, only if cutoff 2 is confirmed; otherwise records why
        not where it may, and answers how the run ended."""
        built: BuiltFile | None = None
        cutoff: AuthorizationResult | None = None
        try:
            assert decision.scope is not None   # an allowed decision always has one
            started = time.monotonic()
            built = self.builder.build(job_id=job.id, attempt_id=attempt_id, tenant_id=job.tenant_id,
                                       scope=decision.scope, stop=stop)
            metrics.worker().build_seconds.observe(time.monotonic() - started)
            metrics.worker().build_bytes.inc(built.size)
            if stop.reason is StopReason.LEASE_LOST:
                raise BuildStopped(StopReason.LEASE_LOST)   # a takeover committed: stop at once
            expected = ExpectedFile(export.final_name(job.delivery_key), built.size, built.sha256)
            # Read while still reversible: past cutoff 2 a failed read could only end OutcomeUnknown.
            # The original ended before this replacement was created, so its expected file is final.
            with self.db.connection() as conn:
                original = read_original_expected(conn, job)

            # Cutoff 2. This write, not the watcher, guarantees a stop request committed first wins.
            cutoff = self._authorize(job, attempt_id, expected)
            if cutoff is AuthorizationResult.LEASE_LAPSED and keeper.renew_now() is RenewResult.RENEWED:
                # Still the owner, only late: the renewal succeeds only if no takeover committed.
                cutoff = self._authorize(job, attempt_id, expected)

            match cutoff:
                case AuthorizationResult.AUTHORIZED:
                    log.info("runner.authorized", job_id=job.id, attempt_id=attempt_id, size=built.size)
                    return Prepared(built, expected, original)
                case AuthorizationResult.STOP_RECORDED:
                    write = export.finish_stopped(self.db, job_id=job.id, attempt_id=attempt_id,
                                                worker_id=worker_id, stop_point="BeforeDelivery")
                    if write is WriteResult.WRITTEN:
                        metrics.worker().stops_obeyed.inc()
                    return RunResult(RunOutcome.STOPPED, attempt_id, write)
                case AuthorizationResult.ORIGINAL_COMPLETED:
                    write = export.finish_failed(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                               failure_reason=FailureCode.ORIGINAL_DELIVERED,
                                               detail="the original was recorded Completed before cutoff 2")
                    return RunResult(RunOutcome.FAILED, attempt_id, write)
                case AuthorizationResult.LEASE_LAPSED | AuthorizationResult.NOT_OWNER | AuthorizationResult.UNKNOWN:
                    # Write nothing to the row: recovery takes it from here.
                    log.warning("runner.not_authorized", job_id=job.id, attempt_id=attempt_id, cutoff=cutoff.value)
                    return RunResult(RunOutcome.GAVE_UP, attempt_id)
        except BuildStopped as stopped:
            if stopped.reason is StopReason.STOP_REQUESTED:
                write = export.finish_stopped(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                            stop_point="WhileBuilding")
                if write is WriteResult.WRITTEN:
                    metrics.worker().stops_obeyed.inc()
                    metrics.worker().stop_latency.observe(stop.seconds_since_set())
                return RunResult(RunOutcome.STOPPED, attempt_id, write)
            # A lost lease (the attempt owns nothing) or a shutdown (recovery takes over): write nothing.
            log.warning("runner.build_abandoned", job_id=job.id, attempt_id=attempt_id, reason=stopped.reason.value)
            return RunResult(RunOutcome.GAVE_UP, attempt_id)
        except BuildFailed as failed:
            # Running -> Failed; nothing has left the process. Matches nothing after a takeover.
            log.warning("runner.build_failed", job_id=job.id, attempt_id=attempt_id, error=failed)
            write = export.finish_failed(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                       failure_reason=FailureCode.BUILD_FAILED, detail=str(failed)[:300])
            return RunResult(RunOutcome.FAILED, attempt_id, write)
        finally:
            if cutoff is not AuthorizationResult.AUTHORIZED:
                keeper.finish()   # this attempt's last write, if it made one, is behind it
                if built is not None:
                    # Contact data on disk for a delivery nobody may resume is the worse risk.
                    built.delete()
        raise AssertionError("unreachable")   # pragma: no cover

    def _authorize(self, job: JobView, attempt_id: UUID, expected: ExpectedFile) -> AuthorizationResult:
        return export.authorize_delivery(self.db, job_id=job.id, tenant_id=job.tenant_id, attempt_id=attempt_id,
                                       expected=expected, replaces_job_id=job.replaces_job_id)

    # --- past cutoff 2: the upload is made safe to interrupt, not cancellable ---------------------

    def _deliver(self, job: JobView, decision: Decision, attempt_id: UUID, worker_id: str,
                 prepared: Prepared, keeper: LeaseKeeper) -> RunResult:
        built, expected = prepared.built, prepared.expected
        observed_by = f"{worker_id}/{attempt_id}"

        def record(evidence: Evidence) -> None:
            # Appended whoever owns the job now; it never touches the job's status. Raising here
            # before the upload keeps the upload from starting.
            self._append_evidence(job.id, attempt_id, observed_by, evidence.to_detail())

        interrupted: BaseException | None = None
        started = time.monotonic()
        try:
            try:
                assert decision.destination is not None   # an allowed decision always has one
                destination = self.destination_for(decision.destination)
                outcome = destination.deliver(
                    built.path, expected, attempt_id=str(attempt_id),
                    replacement=job.replaces_job_id is not None,
                    replacement_of=prepared.original,
                    overwrite_agreed=job.overwrite_agreement_ref is not None, record_evidence=record)
            except BaseException as exc:
                # Failed only when the error proves the final name was never written; here it cannot.
                # A shutdown still gets its evidence and terminal write tried, then propagates.
                outcome = classify(exc, stage=Stage.UNKNOWN)
                if not isinstance(exc, Exception):
                    interrupted = exc
            status, code, detail = _terminal(outcome)
            try:
                self._append_evidence(job.id, attempt_id, observed_by, _outcome_detail(outcome, attempt_id))
            except Exception as exc:
                log.error("runner.evidence_not_recorded", job_id=job.id, attempt_id=attempt_id, error=type(exc).__name__)
            metrics.worker().upload_seconds.observe(time.monotonic() - started)
            metrics.worker().deliveries.labels(status.value).inc()
            if status is Status.COMPLETED:
                metrics.worker().upload_bytes.inc(built.size)
            write = export.finish_delivery(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                         outcome=status, failure_reason=code, detail=detail)
            log.info("runner.delivered", job_id=job.id, attempt_id=attempt_id, outcome=status.value, write=write.value)
            if interrupted is not None:
                raise interrupted
            return RunResult(RunOutcome.DELIVERED, attempt_id, write, status)
        finally:
            keeper.finish()   # right after the terminal write, so no renewal reports a false loss
            built.delete()

    def _append_evidence(self, job_id: UUID, attempt_id: UUID, observed_by: str, detail: str) -> None:
        with self.db.connection() as conn:
            if not export.append_evidence(conn, job_id=job_id, attempt_id=attempt_id, observed_by=observed_by,
                                        detail=detail):
                raise RuntimeError("delivery evidence was not appended")


def _terminal(outcome: DeliveryOutcome) -> tuple[Status, FailureCode | None, str | None]:
    match outcome:
        case Completed(receipt=receipt):
            return Status.COMPLETED, None, f"proof={receipt.proof.value}"
        case Failed(code=code, detail=detail):
            return Status.FAILED, code, detail[:300]
        case Unknown(detail=detail):
            return Status.OUTCOME_UNKNOWN, None, detail[:300]
    raise AssertionError(f"unexpected delivery outcome {outcome!r}")


def _outcome_detail(outcome: DeliveryOutcome, attempt_id: UUID) -> str:
    """The attempt's own account of its delivery, kept even when its terminal write matches nothing."""
    payload: dict[str, object] = {"stage": "outcome", "attempt_id": str(attempt_id), "outcome": outcome.status}
    match outcome:
        case Completed(receipt=receipt):
            payload["receipt"] = json.loads(receipt.to_detail())
        case Failed(code=code, detail=detail):
            payload.update(code=code.value, detail=detail)
        case Unknown(detail=detail):
            payload["detail"] = detail
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)
