"""The export runner: the reference's ExportRunner, top to bottom.

hint (re-read the row, and the destination's circuit) -> policy -> claim (cutoff 1) -> lease keeper and
stop watcher -> circuit gate -> build -> prepare the delivery (session, baseline, decision) -> cutoff 2
(one retry after an on-demand renewal) -> deliver on the prepared session -> evidence -> terminal write.

Every write goes through ``app.store.export`` and is conditional; those after the claim also require
this attempt, so an attempt that lost ownership changes nothing, and its catch blocks record nothing.
Stop requests are obeyed until cutoff 2 and recorded (TooLate, by the cancellation path) after it; a
lost lease stops preparation but never an upload. Before cutoff 2 the partner is reached while still
reversible: one it cannot reach defers the job (``app.actors.deferral``) instead of failing it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from app import logs, metrics
from app.actors.builder import BuildFailed, BuildInterrupted, BuildStopped, BuiltFile, ContactsBuilder
from app.actors.deferral import CIRCUIT_OPEN, PROBE_FAILED, Circuits, DeferralPolicy, session_busy_seconds
from app.actors.endings import Endings, RunOutcome, RunResult
from app.actors.lease import LeaseKeeper, Leases
from app.actors.partner_file import Changes
from app.actors.policy import Decision, ExportPolicy
from app.actors.stop import StopReason, StopSignal
from app.actors.watcher import StopWatcher
from app.delivery.classifier import Stage, classify, outcome_evidence, terminal_write
from app.delivery.config import DestinationConfig
from app.delivery.destination import Destination, Refused, Unreachable
from app.delivery.evidence import Evidence
from app.delivery.modes import DeliveryMode
from app.delivery.openpgp import OpenPGPError
from app.delivery.profile import Marker, Profile
from app.delivery.sessions import SessionPool
from app.delivery.upload import Ready
from app.errors import ExportsError
from app.store import export
from app.store.database import Database
from app.store.partner import Circuit
from app.store.types import (
    AuthorizationResult,
    ClaimResult,
    ExpectedFile,
    FailureCause,
    FailureCode,
    RenewResult,
    Status,
    WriteResult,
)
from app.store.worker import JobView, read_job

log = logs.get(__name__)

_CLAIM_LABEL = {ClaimResult.CLAIMED: "won", ClaimResult.LOST: "lost", ClaimResult.UNKNOWN: "unknown"}


class EvidenceNotAppended(ExportsError):
    """Raised when delivery evidence matched no export row, so nothing was appended: the baseline of a
    refused delivery, whose Failed write would then record a refusal without its proof."""


class PendingEvidence:
    """What an attempt observed at the partner, held for the attempt's next write, which appends it in the
    same statement: the baseline with cutoff 2, what was seen after it with the terminal write. An attempt
    that crashes in between loses only observations recovery makes again from the destination itself."""

    def __init__(self) -> None:
        self._details: list[str] = []

    def __call__(self, evidence: Evidence) -> None:
        self._details.append(evidence.to_detail())

    def take(self) -> list[str]:
        details, self._details = self._details, []
        return details


@dataclass(frozen=True)
class Prepared:
    """What an attempt past cutoff 2 delivers: the built file, what cutoff 2 recorded, and the delivery
    prepared on its session before cutoff 2."""

    built: BuiltFile
    expected: ExpectedFile
    ready: Ready
    #: Where the delivery records what it observes, for the terminal write to append.
    evidence: PendingEvidence


def _observer(worker_id: str, attempt_id: UUID) -> str:
    """Who observed a delivery's evidence: the worker and the attempt."""
    return f"{worker_id}/{attempt_id}"


def worker_identity() -> str:
    """hostname:pid:thread, so an operator can find the process and thread behind an attempt."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


DestinationFactory = Callable[[DestinationConfig], Destination]


class ExportRunner:
    def __init__(
        self, *, db: Database, lease_seconds: float, policy: ExportPolicy, builder: ContactsBuilder,
        leases: Leases, watcher: StopWatcher, destination_for: DestinationFactory = Destination,
        worker_id: Callable[[], str] = worker_identity, sessions: SessionPool | None = None,
        deferrals: DeferralPolicy | None = None,
    ) -> None:
        self.db = db
        self.lease_seconds = lease_seconds
        self.policy = policy
        self.builder = builder
        self.leases = leases
        self.watcher = watcher
        self.destination_for = destination_for
        self.worker_id = worker_id
        #: The process's SSH sessions, warm between deliveries; without slots, a session limit is not kept.
        self.sessions = sessions or SessionPool()
        self.deferrals = deferrals or DeferralPolicy(probe_seconds=lease_seconds)
        self.circuits = Circuits(db, self.deferrals)
        self.endings = Endings(db, self.deferrals)
        self._active: set[StopSignal] = set()
        self._active_lock = threading.Lock()

    def shutdown(self) -> int:
        """The worker is stopping: ends every attempt still preparing, writing nothing (the job stays
        Running and recovery takes it over when its lease expires). Uploads are not interrupted: past
        cutoff 2 the signal is ignored. Returns how many attempts were signalled."""
        with self._active_lock:
            active = list(self._active)
        return sum(1 for stop in active if stop.set(StopReason.SHUTDOWN))

    def in_flight(self) -> int:
        """How many attempts this runner holds: claimed, their last write not yet made. Without the lock:
        a signal handler asks, on the main thread, which may hold the lock in ``shutdown`` when the
        signal interrupts it (``len`` of a set is one step under the GIL)."""
        return len(self._active)

    def run(self, job_id: UUID) -> RunResult:
        # Bound for this thread until the run returns: every line about the job, whichever module
        # writes it (the store, the delivery), carries its id.
        with logs.bound(job_id=job_id):
            return self._run(job_id)

    def _run(self, job_id: UUID) -> RunResult:
        # The message is only a hint. Everything below starts from the row.
        with self.db.connection() as conn:
            # One read: the job, its destination, the destination's circuit and a replacement's original.
            job = read_job(conn, job_id)
        if job is None or job.status is not Status.QUEUED:
            return RunResult(RunOutcome.NOT_QUEUED)
        with logs.bound(tenant_id=job.tenant_id):
            if job.held is not None:
                # Not claimed, so nothing to undo: it stays Queued, and the resume's statement wakes it.
                log.info("runner.held", held=job.held)
                return RunResult(RunOutcome.HELD, tenant_id=job.tenant_id)
            return dataclasses.replace(self._evaluated(job), tenant_id=job.tenant_id)

    def _evaluated(self, job: JobView) -> RunResult:
        decision = self.policy.evaluate(job)
        if not decision.allowed:
            # Queued -> Rejected, this version only: after an edit this matches nothing, and the
            # edit's own wake-up brings the job back for a fresh evaluation.
            with self.db.connection() as conn:
                rejected = export.reject(conn, job_id=job.id, checked_version=job.version)
            assert decision.refusal is not None
            log.info("runner.rejected", version=job.version, refusal=decision.refusal.value, written=rejected)
            return RunResult(RunOutcome.REJECTED)

        # Cutoff 1.
        attempt_id = uuid.uuid4()
        with logs.bound(attempt_id=attempt_id):
            return self._attempt(job, decision, job.circuit, attempt_id)

    def _attempt(self, job: JobView, decision: Decision, circuit: Circuit, attempt_id: UUID) -> RunResult:
        worker_id = self.worker_id()
        claim = export.claim(self.db, job_id=job.id, checked_version=job.version, attempt_id=attempt_id,
                           worker_id=worker_id, lease_seconds=self.lease_seconds)
        metrics.worker().claims.labels(_CLAIM_LABEL[claim]).inc()
        if claim is ClaimResult.UNKNOWN:
            return RunResult(RunOutcome.CLAIM_UNKNOWN, attempt_id)   # leave the message unsettled
        if claim is ClaimResult.LOST:
            return RunResult(RunOutcome.NOT_CLAIMED)
        log.info("runner.claimed", worker_id=worker_id)

        # From the confirmed claim to the attempt's last write: one stop signal, one lease keeper.
        stop = StopSignal()
        with self._active_lock:
            self._active.add(stop)
        keeper = self.leases.keep(job.id, attempt_id, stop)
        watch = self.watcher.watch(job.id, attempt_id, stop)
        try:
            prepared = self._prepare(job, decision, attempt_id, worker_id, keeper, stop, circuit)
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
                 keeper: LeaseKeeper, stop: StopSignal, circuit: Circuit) -> Prepared | RunResult:
        """The file and the prepared delivery, only if cutoff 2 is confirmed; otherwise records why not
        where it may (stopped, failed, deferred), and answers how the run ended."""
        built: BuiltFile | None = None
        ready: Ready | None = None
        cutoff: AuthorizationResult | None = None
        try:
            assert decision.scope is not None and decision.destination is not None   # allowed decisions have both
            destination = self.destination_for(decision.destination)
            sessions = self.sessions.for_destination(job.destination_id)
            admission = self.circuits.admit(job.destination_id, attempt_id, circuit)
            if not admission.go:
                # Turned away without building: the circuit says the partner is down.
                return self.endings.defer(job, attempt_id, worker_id, keeper, cause=CIRCUIT_OPEN,
                                   delay=admission.wait_seconds, reason="circuit_open")
            if admission.probing:
                # The probe connects before it builds: while the partner stays down, a probe costs a
                # connection attempt and no build. Its session is kept warm for the delivery.
                # Anything else it finds (no free slot, a configuration error) the delivery finds again.
                unreachable = destination.probe(sessions=sessions)
                if unreachable is not None and unreachable.cause is FailureCause.TRANSIENT \
                        and not unreachable.session_limit:
                    self.circuits.failed(job.destination_id, attempt_id, unreachable.detail)
                    return self.endings.defer(job, attempt_id, worker_id, keeper, delay=self.endings.backoff(job),
                                       cause=f"{PROBE_FAILED}{unreachable.detail}", reason="unreachable")
                if unreachable is None:
                    # Closed now, not after this build: the attempts it turned away may come back.
                    self.circuits.reached(job.destination_id, was_open=True)
            try:
                profile = Profile.from_json(job.profile or {})
            except (ValueError, KeyError, TypeError, OpenPGPError) as exc:
                # Written by a later release, or by hand: not an export this one can build.
                raise BuildFailed(f"the delivery profile v{job.profile_version} cannot be read: "
                                  f"{type(exc).__name__}", FailureCause.CONFIGURATION) from exc
            mode = decision.destination.delivery_mode
            if mode.needs_marker and profile.marker is Marker.NONE:
                raise BuildFailed(f"delivery mode {mode.value} publishes a file by its completion marker, and "
                                  f"profile v{job.profile_version} writes none", FailureCause.CONFIGURATION)
            started = time.monotonic()
            built = self.builder.build(job_id=job.id, attempt_id=attempt_id, tenant_id=job.tenant_id,
                                       scope=decision.scope, stop=stop, profile=profile,
                                       changes=Changes(job.incremental_since) if job.incremental else None)
            metrics.worker().build_seconds.observe(time.monotonic() - started)
            metrics.worker().build_bytes.inc(built.size)
            if stop.reason is StopReason.STOP_REQUESTED:
                return self.endings.finish_stopped(job, attempt_id, worker_id, keeper, "BeforeDelivery", stop)
            if stop.is_set():
                raise BuildStopped(stop.reason or StopReason.SHUTDOWN)   # a takeover or a shutdown: stop here
            marker = profile.marker_file(job.file_name, size=built.size, sha256=built.sha256, rows=built.rows,
                                         export_id=job.id, delivery_key=job.delivery_key)
            marker_name, marker_content = marker or (None, None)
            expected = ExpectedFile(job.file_name, built.size, built.sha256, marker_name, marker_content,
                                    snapshot=built.snapshot)
            original = job.original_expected   # read with the job: final, since the original had ended

            # Reach the partner while the job is Running: a session, the baseline, the decision.
            pending = PendingEvidence()
            preparation = destination.prepare(
                expected, attempt_id=str(attempt_id), replacement=job.replaces_job_id is not None,
                replacement_of=original, overwrite_agreed=job.overwrite_agreement_ref is not None,
                record_evidence=pending, sessions=sessions)
            was_open = circuit.open or admission.probing
            match preparation:
                case Unreachable(session_limit=True, detail=detail):
                    return self.endings.defer(job, attempt_id, worker_id, keeper, cause=f"session limit: {detail}",
                                              delay=session_busy_seconds(), reason="session_limit")
                case Unreachable(cause=FailureCause.TRANSIENT, detail=detail):
                    self.circuits.failed(job.destination_id, attempt_id, detail)
                    return self.endings.defer(job, attempt_id, worker_id, keeper, cause=detail,
                                              delay=self.endings.backoff(job), reason="unreachable")
                case Unreachable(cause=cause, detail=detail):
                    # A configuration error: trying again later would fail the same way.
                    self.circuits.reached(job.destination_id, was_open=was_open)
                    return self.endings.fail_or_stop(job, attempt_id, worker_id, keeper, FailureCode.NOT_DELIVERED,
                                                     f"the partner refused the configuration: {detail}", cause)
                case Refused(outcome=refused):
                    self.circuits.reached(job.destination_id, was_open=was_open)
                    # The refusal's proof, the baseline, goes in before the refusal does; without it, no
                    # refusal: the database that could not take it could not take the Failed either, and
                    # recovery takes the attempt over.
                    try:
                        self._append_evidence(job.id, attempt_id, _observer(worker_id, attempt_id), pending.take())
                    except Exception as exc:
                        log.warning("runner.baseline_not_recorded", error=type(exc).__name__)
                        return RunResult(RunOutcome.GAVE_UP, attempt_id)
                    return self.endings.fail_or_stop(job, attempt_id, worker_id, keeper, refused.code, refused.detail,
                                                     refused.cause)
                case Ready():
                    ready = preparation
                    self.circuits.reached(job.destination_id, was_open=was_open)

            # Cutoff 2, with the baseline. This write, not the watcher, guarantees a stop request committed
            # first wins.
            baseline = pending.take()
            cutoff = self._authorize(job, attempt_id, worker_id, expected, baseline, mode)
            if cutoff is AuthorizationResult.LEASE_LAPSED and keeper.renew_now() is RenewResult.RENEWED:
                # Still the owner, only late: the renewal succeeds only if no takeover committed. The
                # baseline goes again (the first statement may not have run): a repeated observation
                # only repeats what the first said.
                cutoff = self._authorize(job, attempt_id, worker_id, expected, baseline, mode)

            match cutoff:
                case AuthorizationResult.AUTHORIZED:
                    log.info("runner.authorized", size=built.size)
                    return Prepared(built, expected, ready, pending)
                case AuthorizationResult.STOP_RECORDED:
                    return self.endings.finish_stopped(job, attempt_id, worker_id, keeper, "BeforeDelivery", stop)
                case AuthorizationResult.ORIGINAL_COMPLETED:
                    return self.endings.fail_or_stop(job, attempt_id, worker_id, keeper, FailureCode.ORIGINAL_DELIVERED,
                                                     "the original was recorded Completed before cutoff 2")
                case AuthorizationResult.LEASE_LAPSED | AuthorizationResult.NOT_OWNER | AuthorizationResult.UNKNOWN:
                    # Write nothing to the row: recovery takes it from here.
                    log.warning("runner.not_authorized", cutoff=cutoff.value)
                    return RunResult(RunOutcome.GAVE_UP, attempt_id)
        except BuildStopped as stopped:
            if stopped.reason is StopReason.STOP_REQUESTED:
                return self.endings.finish_stopped(job, attempt_id, worker_id, keeper, "WhileBuilding", stop)
            # A lost lease (the attempt owns nothing) or a shutdown (recovery takes over): write nothing.
            log.warning("runner.build_abandoned", reason=stopped.reason.value)
            return RunResult(RunOutcome.GAVE_UP, attempt_id)
        except BuildInterrupted as interrupted:
            # The database, not the export, failed: nothing is written, and recovery requeues the job.
            log.warning("runner.build_interrupted", error=interrupted)
            return RunResult(RunOutcome.GAVE_UP, attempt_id)
        except BuildFailed as failed:
            # Running -> Failed; nothing has left the process. Matches nothing after a takeover.
            log.warning("runner.build_failed", error=failed)
            return self.endings.fail_or_stop(job, attempt_id, worker_id, keeper, FailureCode.BUILD_FAILED, str(failed),
                                             failed.cause, stop_point="WhileBuilding")
        finally:
            if cutoff is not AuthorizationResult.AUTHORIZED:
                if ready is not None:
                    ready.release()
                keeper.finish()   # this attempt's last write, if it made one, is behind it
                if built is not None:
                    # Contact data on disk for a delivery nobody may resume is the worse risk.
                    built.delete()
        raise AssertionError("unreachable")   # pragma: no cover

    def _authorize(self, job: JobView, attempt_id: UUID, worker_id: str, expected: ExpectedFile,
                   baseline: list[str], mode: DeliveryMode) -> AuthorizationResult:
        return export.authorize_delivery(self.db, job_id=job.id, tenant_id=job.tenant_id, attempt_id=attempt_id,
                                         expected=expected, replaces_job_id=job.replaces_job_id, evidence=baseline,
                                         observed_by=_observer(worker_id, attempt_id),
                                         profile_version=job.profile_version, delivery_mode=mode.value)

    # --- past cutoff 2: the upload is made safe to interrupt, not cancellable ---------------------

    def _deliver(self, job: JobView, decision: Decision, attempt_id: UUID, worker_id: str,
                 prepared: Prepared, keeper: LeaseKeeper) -> RunResult:
        built = prepared.built
        interrupted: BaseException | None = None
        started = time.monotonic()
        try:
            try:
                outcome = prepared.ready.complete(built.path)
            except BaseException as exc:
                # Failed only when the error proves the final name was never written; here it cannot.
                # A shutdown still gets its evidence and terminal write tried, then propagates.
                outcome = classify(exc, stage=Stage.UNKNOWN)
                if not isinstance(exc, Exception):
                    interrupted = exc
            status, code, detail, cause = terminal_write(outcome)
            metrics.worker().upload_seconds.observe(time.monotonic() - started)
            metrics.worker().deliveries.labels(status.value).inc()
            if status is Status.COMPLETED:
                metrics.worker().upload_bytes.inc(built.size)
            # What the delivery observed and its outcome, appended in the terminal write's statement
            # whether or not the write matches: after a takeover, recovery weighs them.
            evidence = [*prepared.evidence.take(), outcome_evidence(outcome, attempt_id)]
            keeper.ending()
            write = export.finish_delivery(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                           outcome=status, failure_reason=code, detail=detail, cause=cause,
                                           evidence=evidence, observed_by=_observer(worker_id, attempt_id))
            if status is Status.COMPLETED:
                log.info("runner.delivered", outcome=status.value, write=write.value,
                         warm_session=prepared.ready.reused_session)
            else:
                # Failed, or OutcomeUnknown (a person may be needed): an operator's alerts and searches look here.
                log.warning("runner.delivered", outcome=status.value, write=write.value, code=code, cause=cause,
                            detail=detail, warm_session=prepared.ready.reused_session)
            if write is not WriteResult.WRITTEN:
                log.warning("runner.terminal_write_not_matched", outcome=status.value, write=write.value)
            if interrupted is not None:
                raise interrupted
            return RunResult(RunOutcome.DELIVERED, attempt_id, write, status)
        finally:
            prepared.ready.release(reusable=False)   # already given back unless complete() never ran
            keeper.finish()   # right after the terminal write, so no renewal reports a false loss
            built.delete()

    def _append_evidence(self, job_id: UUID, attempt_id: UUID, observed_by: str, details: list[str]) -> None:
        with self.db.connection() as conn:
            for detail in details:
                if not export.append_evidence(conn, job_id=job_id, attempt_id=attempt_id, observed_by=observed_by,
                                              detail=detail):
                    raise EvidenceNotAppended(f"delivery evidence for export {job_id} matched no export row")
