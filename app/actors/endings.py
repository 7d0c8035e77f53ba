"""How an attempt ends before cutoff 2, each through its conditional write: Stopped, Failed, or deferred
back to Queued; and how a run of the export actor ended.

Each write re-reads the row when it matches nothing or loses its answer (``app.store.export``), so
whatever it reports is what the row says: a stop request recorded first wins over a Failed and over a
deferral, and a takeover makes every one of them match nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from uuid import UUID

from app import logs, metrics
from app.actors.deferral import DeferralPolicy, backoff_seconds
from app.actors.lease import LeaseKeeper
from app.actors.stop import StopReason, StopSignal
from app.store import export
from app.store.database import Database
from app.store.types import DeferResult, FailureCause, FailureCode, RenewResult, Status, WriteResult
from app.store.worker import JobView

log = logs.get(__name__)


class RunOutcome(enum.Enum):
    """Where a run ended. Only CLAIM_UNKNOWN leaves the message unsettled."""

    NOT_QUEUED = "NotQueued"            # the hint was stale: canceled, claimed, ended, or not found
    REJECTED = "Rejected"               # policy refused this version (the write may have matched nothing)
    HELD = "Held"                       # its tenant or destination is paused: not claimed; the resume wakes it
    NOT_CLAIMED = "NotClaimed"          # cutoff 1 lost: another claim, a cancel or an edit won
    CLAIM_UNKNOWN = "ClaimUnknown"      # the claim and its re-read both failed
    STOPPED = "Stopped"                 # a recorded stop request ended the attempt before cutoff 2
    FAILED = "Failed"                   # before cutoff 2: the build failed, the final name was taken, the
                                        # partner refused the configuration or stayed unreachable too long
    DEFERRED = "Deferred"               # the partner could not be reached: back to Queued, woken later
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
    #: The job's tenant, once the runner read the row: for the actor's line about the run.
    tenant_id: UUID | None = None


class Endings:
    """The attempt's writes that end it before cutoff 2, for the runner (whose binding gives its lines
    the job's and the attempt's ids)."""

    def __init__(self, db: Database, policy: DeferralPolicy) -> None:
        self.db = db
        self.policy = policy

    def backoff(self, job: JobView) -> float:
        """The delay of the job's next deferral, from how often it was deferred."""
        return backoff_seconds(job.deferrals, base=self.policy.base_seconds, cap=self.policy.max_seconds)

    def defer(self, job: JobView, attempt_id: UUID, worker_id: str, keeper: LeaseKeeper, *, cause: str,
               delay: float, reason: str) -> RunResult:
        """Running -> Queued with a wake-up due in ``delay``; past the deferral budget, Failed instead."""
        spent = job.deferred_for_seconds
        if spent is not None and spent >= self.policy.total_seconds:
            return self.fail_or_stop(
                job, attempt_id, worker_id, keeper, FailureCode.NOT_DELIVERED,
                f"the partner could not be reached for {spent:.0f} s after {job.deferrals} deferrals; last: {cause}",
                FailureCause.TRANSIENT)
        keeper.ending()
        result = export.defer(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id, cause=cause[:300],
                              delay_seconds=delay)
        if result is DeferResult.LEASE_LAPSED and keeper.renew_now() is RenewResult.RENEWED:
            result = export.defer(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                  cause=cause[:300], delay_seconds=delay)
        match result:
            case DeferResult.DEFERRED:
                metrics.worker().deferrals.labels(reason).inc()
                log.info("runner.deferred", cause=cause, delay=round(delay, 3), deferrals=job.deferrals + 1)
                return RunResult(RunOutcome.DEFERRED, attempt_id, WriteResult.WRITTEN)
            case DeferResult.STOP_RECORDED:
                return self.finish_stopped(job, attempt_id, worker_id, keeper, "BeforeDelivery", None)
        log.warning("runner.not_deferred", result=result.value)
        return RunResult(RunOutcome.GAVE_UP, attempt_id)

    def fail_or_stop(self, job: JobView, attempt_id: UUID, worker_id: str, keeper: LeaseKeeper, code: FailureCode,
                     detail: str, cause: FailureCause | None = None, *,
                     stop_point: str = "BeforeDelivery") -> RunResult:
        """Running -> Failed before cutoff 2; a stop request recorded first wins, and the attempt records
        Stopped instead (``export_finish_failed`` matches nothing then)."""
        keeper.ending()
        write = export.finish_failed(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                     failure_reason=code, detail=detail[:300], cause=cause)
        if write is WriteResult.NOT_MATCHED:
            stopped = export.finish_stopped(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                            stop_point=stop_point)
            if stopped is WriteResult.WRITTEN:
                metrics.worker().stops_obeyed.inc()
                return RunResult(RunOutcome.STOPPED, attempt_id, stopped)
        if write is WriteResult.WRITTEN:
            # The detail went into the row too: what it says is redacted where it is made.
            log.warning("runner.failed", code=code, cause=cause, detail=detail[:300])
        else:
            # Not a failure of this attempt's making: a takeover or another outcome got there first.
            log.warning("runner.terminal_write_not_matched", write=write.value)
        return RunResult(RunOutcome.FAILED, attempt_id, write)

    def finish_stopped(self, job: JobView, attempt_id: UUID, worker_id: str, keeper: LeaseKeeper, stop_point: str,
                       stop: StopSignal | None) -> RunResult:
        keeper.ending()
        write = export.finish_stopped(self.db, job_id=job.id, attempt_id=attempt_id, worker_id=worker_id,
                                      stop_point=stop_point)
        if write is WriteResult.WRITTEN:
            metrics.worker().stops_obeyed.inc()
            if stop is not None and stop.reason is StopReason.STOP_REQUESTED:
                metrics.worker().stop_latency.observe(stop.seconds_since_set())
        return RunResult(RunOutcome.STOPPED, attempt_id, write)
