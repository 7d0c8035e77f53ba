"""Recovery: takes over attempts whose lease expired, then reconciles OutcomeUnknown jobs whose
appended evidence now proves a completed delivery.

Every write is one of the conditional statements in ``app/store/recovery.py`` (or reconciliation's in
``app/store/export.py``): the scan only nominates, and each takeover repeats every condition the
decision relied on. So any number of schedulers can run at once: of two that decide the same takeover,
one write matches and the other matches nothing, and nothing is recorded twice.

An expired Delivering attempt is resolved only from evidence (``app.delivery.verdicts``): Completed
when the destination, or a receipt the attempt appended, shows the expected file; OutcomeUnknown
otherwise. Never Failed from an absent file: a paused worker can outlast any timeout.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from dataclasses import dataclass
from typing import assert_never
from uuid import UUID

from app import logs
from app.config import ConfigError, Settings
from app.delivery.evidence import Evidence, EvidenceStage
from app.delivery.modes import DeliveryMode
from app.delivery.verdicts import (
    AttemptEvidence,
    DeliveryVerdict,
    Resolution,
    decide_delivery,
    expected_file,
    parse_evidence,
)
from app.maintenance.inspection import DestinationInspector, FinishMarker, InspectDestination, MarkerFinisher
from app.store import export, recovery
from app.store.database import Database
from app.store.recovery import ExpiredAttempt, InspectionClaim, UnknownOutcome
from app.store.types import ExpectedFile, FailureCode, Status

log = logs.get(__name__)

#: Expired attempts one recovery scan nominates.
DEFAULT_RECOVERY_BATCH = 100
#: OutcomeUnknown jobs one reconciliation page reads.
DEFAULT_RECONCILE_BATCH = 200
#: Longest evidence summary recorded in an event's detail, in characters.
MAX_SUMMARY_CHARS = 300


@dataclass(frozen=True)
class RecoveryConfig:
    max_attempts: int
    batch_size: int = DEFAULT_RECOVERY_BATCH
    reconcile_batch_size: int = DEFAULT_RECONCILE_BATCH

    def __post_init__(self) -> None:
        for name in ("max_attempts", "batch_size", "reconcile_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a whole number of at least 1, not {value!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> RecoveryConfig:
        return cls(max_attempts=settings.max_attempts)


class Takeover(enum.Enum):
    """What recovery decided for one expired attempt; each has its own conditional statement."""

    STOP = "stop"                    # Running with a stop request -> Stopped
    REQUEUE = "requeue"              # Running, no stop, under the cap -> Queued with a new wake-up
    EXHAUST = "exhaust"              # Running at the cap -> Failed, AttemptsExhausted
    COMPLETE = "complete"            # Delivering, evidence matches -> Completed
    OUTCOME_UNKNOWN = "unknown"      # Delivering, no matching evidence -> OutcomeUnknown


@dataclass(frozen=True)
class RecoveryCounts:
    scanned: int = 0
    stopped: int = 0
    requeued: int = 0
    exhausted: int = 0
    completed: int = 0
    outcome_unknown: int = 0
    #: Takeovers that matched nothing: a renewal, another scheduler or the worker got there first.
    not_matched: int = 0
    #: Expired deliveries another scheduler was inspecting when this one came to them.
    claimed_elsewhere: int = 0
    #: OutcomeUnknown jobs reconciled to Completed from appended evidence.
    reconciled: int = 0
    errors: int = 0

    def as_fields(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def _logged(event: str, run_id: str, counts: RecoveryCounts) -> RecoveryCounts:
    """One line for a run that did something."""
    if any(counts.as_fields().values()):
        log.info(event, run_id=run_id, **{k: v for k, v in counts.as_fields().items() if v})
    return counts


_COUNT_FIELD = {Takeover.STOP: "stopped", Takeover.REQUEUE: "requeued", Takeover.EXHAUST: "exhausted",
                Takeover.COMPLETE: "completed", Takeover.OUTCOME_UNKNOWN: "outcome_unknown"}
#: The event of a takeover that was written, spelled out so that each can be found by its name.
_TAKEOVER_EVENT = {Takeover.STOP: "recovery.stop", Takeover.REQUEUE: "recovery.requeue",
                   Takeover.EXHAUST: "recovery.exhaust", Takeover.COMPLETE: "recovery.complete",
                   Takeover.OUTCOME_UNKNOWN: "recovery.unknown"}

#: The takeovers that leave an export Failed (with its code) or waiting for a person: their lines are warnings.
_UNHAPPY: dict[Takeover, dict[str, object]] = {
    Takeover.EXHAUST: {"outcome": Status.FAILED, "code": FailureCode.ATTEMPTS_EXHAUSTED},
    Takeover.OUTCOME_UNKNOWN: {"outcome": Status.OUTCOME_UNKNOWN},
}


def decide_running(job: ExpiredAttempt, max_attempts: int) -> Takeover:
    if job.stop_requested:
        return Takeover.STOP
    # A claim that ended in a deferral never reached the partner's side of the work: it is not an attempt.
    if job.attempt_count - job.deferrals < max_attempts:
        return Takeover.REQUEUE
    return Takeover.EXHAUST


class Recovery:
    """Takes over expired attempts, then reconciles OutcomeUnknown jobs whose evidence now proves a
    completed delivery. ``db`` runs as exports_app."""

    def __init__(self, db: Database, config: RecoveryConfig, inspect_destination: InspectDestination | None = None,
                 finish_marker: FinishMarker | None = None):
        self.db = db
        self.config = config
        self.inspect_destination = inspect_destination or DestinationInspector(db)
        self.finish_marker = finish_marker or MarkerFinisher(db)
        #: Attempts whose missing marker this process tried to finish.
        self._markers_tried: set[UUID] = set()
        #: OutcomeUnknown jobs whose evidence did not prove a delivery, with the attempt and its newest
        #: event when judged: a pass reads their evidence again only once something was appended, so
        #: hundreds of jobs waiting for a person cost one scan per pass, not a query each.
        self._unproven: dict[UUID, tuple[UUID | None, int | None]] = {}

    def run_once(self) -> RecoveryCounts:
        """One whole recovery run: the takeovers, then the reconciliation pass. The scheduler runs the
        two as jobs of their own (``take_over_once``, ``reconcile_once``) so that a long pass over many
        OutcomeUnknown jobs never holds up the takeover of an expired lease."""
        taken, reconciled = self.take_over_once(), self.reconcile_once()
        return RecoveryCounts(**{k: v + getattr(reconciled, k) for k, v in taken.as_fields().items()})

    def take_over_once(self) -> RecoveryCounts:
        """Every expired attempt taken over (Running) or resolved from evidence (Delivering)."""
        run_id = str(uuid.uuid4())
        counts: dict[str, int] = dict(RecoveryCounts().as_fields())
        while True:
            with self.db.connection() as conn:
                candidates = recovery.scan_expired(conn, batch_size=self.config.batch_size)
            counts["scanned"] += len(candidates)
            running = [job for job in candidates if job.status is Status.RUNNING]
            progressed = self._take_over_running(running, run_id, counts)
            for job in candidates:
                if job.status is Status.DELIVERING:
                    # The inspection's own lines (the destination's, the store's) name the job too.
                    with logs.bound(tenant_id=job.tenant_id, job_id=job.job_id, attempt_id=job.attempt_id):
                        progressed |= self._resolve_logged(job, run_id, counts)
            # A full batch may hide more expired attempts; rescan while this batch moved some
            # (a row whose takeover failed would otherwise be nominated again for ever).
            if len(candidates) < self.config.batch_size or not progressed:
                break
        return _logged("recovery.run", run_id, RecoveryCounts(**counts))

    def reconcile_once(self) -> RecoveryCounts:
        """The reconciliation pass: every OutcomeUnknown job whose appended evidence now proves its
        delivery, reconciled to Completed."""
        run_id = str(uuid.uuid4())
        reconciled, errors = self._reconcile(run_id)
        return _logged("recovery.reconciliation", run_id, RecoveryCounts(reconciled=reconciled, errors=errors))

    def _take_over_running(self, jobs: list[ExpiredAttempt], run_id: str, counts: dict[str, int]) -> bool:
        """One batch statement per takeover kind; True when some nomination left the expired set."""
        by_kind: dict[Takeover, list[ExpiredAttempt]] = {}
        for job in jobs:
            by_kind.setdefault(decide_running(job, self.config.max_attempts), []).append(job)
        progressed = False
        for takeover, nominated in by_kind.items():
            pairs = [(job.job_id, job.attempt_id) for job in nominated]
            try:
                with self.db.connection() as conn:
                    written = set(self._write_running(conn, takeover, pairs, run_id))
            except Exception as exc:
                # The batch may have committed without an answer; the next run's scan tells.
                counts["errors"] += len(nominated)
                for job in nominated:
                    log.warning("recovery.takeover_failed", job_id=job.job_id, attempt_id=job.attempt_id,
                                tenant_id=job.tenant_id, run_id=run_id, takeover=takeover.value,
                                error=type(exc).__name__)
                continue
            progressed = True
            for job in nominated:
                self._count(job, takeover, job.job_id in written, run_id, counts)
        return progressed

    def _write_running(self, conn, takeover: Takeover, pairs: list[tuple[UUID, UUID]], run_id: str) -> list[UUID]:
        match takeover:
            case Takeover.STOP:
                return recovery.stop_expired(conn, pairs, recovery_run_id=run_id)
            case Takeover.REQUEUE:
                return recovery.requeue_expired(conn, pairs, max_attempts=self.config.max_attempts,
                                                recovery_run_id=run_id)
            case Takeover.EXHAUST:
                return recovery.exhaust_expired(conn, pairs, max_attempts=self.config.max_attempts,
                                                recovery_run_id=run_id)
            case Takeover.COMPLETE | Takeover.OUTCOME_UNKNOWN:
                raise AssertionError(f"a Running attempt cannot be resolved as {takeover!r}")
            case _ as unreachable:
                assert_never(unreachable)

    def _resolve_logged(self, job: ExpiredAttempt, run_id: str, counts: dict[str, int]) -> bool:
        """Resolves one expired Delivering attempt from evidence, if this scheduler claims its inspection;
        True when it left the expired set or another scheduler has it."""
        try:
            with self.db.connection() as conn:
                claim = recovery.claim_inspection(conn, job_id=job.job_id, attempt_id=job.attempt_id)
                if claim is not InspectionClaim.CLAIMED:
                    # Another scheduler is inspecting it; or, like a takeover that matched nothing, it was
                    # renewed, finished or resolved since the scan.
                    counts["claimed_elsewhere" if claim is InspectionClaim.HELD_ELSEWHERE else "not_matched"] += 1
                    return True
                try:
                    verdict = self._weigh_delivery(conn, job, run_id)
                    takeover = (Takeover.COMPLETE if verdict.resolution is Resolution.COMPLETED
                                else Takeover.OUTCOME_UNKNOWN)
                    written = recovery.resolve_delivering(
                        conn, job_id=job.job_id, expired_attempt_id=job.attempt_id,
                        resolution=verdict.resolution.value, evidence_summary=verdict.summary[:MAX_SUMMARY_CHARS],
                        recovery_run_id=run_id)
                finally:
                    if not conn.broken:
                        recovery.release_inspection(conn, attempt_id=job.attempt_id)
        except Exception as exc:
            # The write may have committed without an answer; the next run's scan tells.
            counts["errors"] += 1
            log.warning("recovery.takeover_failed", job_id=job.job_id, attempt_id=job.attempt_id,
                        tenant_id=job.tenant_id, run_id=run_id, error=type(exc).__name__)
            return False
        self._count(job, takeover, written, run_id, counts)
        return True

    @staticmethod
    def _count(job: ExpiredAttempt, takeover: Takeover, written: bool, run_id: str, counts: dict[str, int]) -> None:
        counts[_COUNT_FIELD[takeover] if written else "not_matched"] += 1
        unhappy = _UNHAPPY.get(takeover) if written else None
        (log.warning if unhappy else log.info)(
            _TAKEOVER_EVENT[takeover] if written else "recovery.not_matched", job_id=job.job_id,
            attempt_id=job.attempt_id, tenant_id=job.tenant_id, run_id=run_id, takeover=takeover.value,
            written=written, **(unhappy or {}))

    def _weigh_delivery(self, conn, job: ExpiredAttempt, run_id: str) -> DeliveryVerdict:
        # No transaction is open: a slow destination holds no row lock, and a renewal that commits
        # meanwhile makes the resolving write match nothing.
        listing, inspect_error = None, None
        try:
            listing = self.inspect_destination(job)
        except Exception as exc:
            # The class only: a destination error can name hosts or paths, never the summary's business.
            inspect_error = type(exc).__name__
            log.warning("recovery.inspect_failed", job_id=job.job_id, attempt_id=job.attempt_id, run_id=run_id,
                        error=inspect_error)
        expected = expected_file(job.expected_file_name, job.expected_file_bytes, job.expected_file_sha256,
                                 job.expected_marker_name, job.expected_marker)
        evidence = parse_evidence(recovery.evidence_details(conn, job_id=job.job_id, attempt_id=job.attempt_id))
        verdict = decide_delivery(expected, replacement=job.replaces_job_id is not None, evidence=evidence,
                                  listing=listing, inspect_error=inspect_error,
                                  mode=DeliveryMode.of(job.expected_delivery_mode))
        if listing is not None:
            # What recovery saw is evidence too, kept with its provenance before the resolution is
            # written; appending never changes the status.
            export.append_evidence(conn, job_id=job.job_id, attempt_id=job.attempt_id, observed_by=run_id,
                                   detail=Evidence(EvidenceStage.INSPECTED, listing, str(job.attempt_id)).to_detail())
        return self._marker_finished(conn, job, expected, evidence, verdict, run_id) or verdict

    def _marker_finished(self, conn, job: ExpiredAttempt | UnknownOutcome, expected: ExpectedFile | None,
                         evidence: AttemptEvidence, verdict: DeliveryVerdict, run_id: str) -> DeliveryVerdict | None:
        """The verdict once a missing completion marker is written, for an attempt whose evidence proves
        its file but not the marker (its worker lost between the two renames); None where there is
        nothing to finish or finishing it failed. The marker goes only where the file is there as
        recorded; what the destination shows afterwards is appended as evidence and decides."""
        mode = DeliveryMode.of(job.expected_delivery_mode)
        if verdict.resolution is Resolution.COMPLETED or expected is None or expected.marker is None \
                or job.attempt_id is None or job.attempt_id in self._markers_tried or not mode.looks:
            return None
        replacement = job.replaces_job_id is not None
        unmarked = dataclasses.replace(expected, marker_name=None, marker=None)
        if decide_delivery(unmarked, replacement=replacement, evidence=evidence, listing=None,
                           inspect_error=None, mode=mode).resolution is not Resolution.COMPLETED:
            return None
        try:
            listing = self.finish_marker(job, expected)
        except Exception as exc:
            # Not reached: the next pass tries again.
            log.warning("recovery.marker_not_finished", job_id=job.job_id, attempt_id=job.attempt_id, run_id=run_id,
                        error=type(exc).__name__)
            return None
        # Reached: once per attempt per scheduler process. A marker name someone else holds is never
        # written over, and asking again every pass would only append the same look again.
        self._markers_tried.add(job.attempt_id)
        if listing is None:
            return None
        export.append_evidence(conn, job_id=job.job_id, attempt_id=job.attempt_id, observed_by=run_id,
                               detail=Evidence(EvidenceStage.INSPECTED, listing, str(job.attempt_id)).to_detail())
        finished = decide_delivery(expected, replacement=replacement, evidence=evidence, listing=listing,
                                   inspect_error=None, mode=mode)
        log.info("recovery.marker_finished", job_id=job.job_id, attempt_id=job.attempt_id, run_id=run_id,
                 marker=expected.marker_name, resolution=finished.resolution.value)
        return finished

    def _reconcile(self, run_id: str) -> tuple[int, int]:
        """One-shot per attempt (the unique index allows one Reconciled event): OutcomeUnknown ->
        Completed when the attempt's appended evidence proves the delivery. Never to Failed: that
        needs the partner's affirmative word, which is an operator's reconciliation."""
        reconciled = errors = 0
        after: UUID | None = None
        seen: set[UUID] = set()
        while True:
            with self.db.connection() as conn:
                page = recovery.scan_outcome_unknown(conn, after=after, batch_size=self.config.reconcile_batch_size)
            for job in page:
                seen.add(job.job_id)
                if self._unproven.get(job.job_id) == (job.attempt_id, job.last_event_id):
                    continue   # judged already, and nothing appended since
                try:
                    reconciled += self._reconcile_one(job, run_id)
                except Exception as exc:
                    errors += 1
                    log.warning("recovery.reconcile_failed", job_id=job.job_id, attempt_id=job.attempt_id,
                                run_id=run_id, error=type(exc).__name__)
            if len(page) < self.config.reconcile_batch_size:
                self._unproven = {k: v for k, v in self._unproven.items() if k in seen}
                return reconciled, errors
            after = page[-1].job_id

    def _reconcile_one(self, job: UnknownOutcome, run_id: str) -> int:
        if job.attempt_id is None:
            return 0
        with self.db.connection() as conn:
            evidence = parse_evidence(recovery.evidence_details(conn, job_id=job.job_id, attempt_id=job.attempt_id))
            if not evidence.observations:
                self._unproven[job.job_id] = (job.attempt_id, job.last_event_id)
                return 0
            expected = expected_file(job.expected_file_name, job.expected_file_bytes, job.expected_file_sha256,
                                     job.expected_marker_name, job.expected_marker)
            verdict = decide_delivery(expected, replacement=job.replaces_job_id is not None, evidence=evidence,
                                      listing=None, inspect_error=None,
                                      mode=DeliveryMode.of(job.expected_delivery_mode))
            verdict = self._marker_finished(conn, job, expected, evidence, verdict, run_id) or verdict
            if verdict.resolution is not Resolution.COMPLETED:
                self._unproven[job.job_id] = (job.attempt_id, job.last_event_id)
                return 0
            written = export.reconcile(conn, tenant_id=job.tenant_id, job_id=job.job_id,
                                       attempt_id=job.attempt_id, resolution=Status.COMPLETED,
                                       evidence=verdict.summary[:MAX_SUMMARY_CHARS], reconciled_by=run_id)
        log.info("recovery.reconciled", job_id=job.job_id, attempt_id=job.attempt_id, run_id=run_id, written=written)
        return int(written)
