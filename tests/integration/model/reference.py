"""A reference model of the job protocol, written from the reference design
(/work/shared/seed/000_b3cf395946b6e0a0.txt) and docs/protocol.md, apart from the implementation:
it imports nothing from ``app``, has its own states as plain strings, and its own rules for who may
write what. Each operation answers what the protocol says it must answer and changes the model as the
protocol says the row must change, including the history the write must record.

The model is a value (``copy.deepcopy`` gives an independent one), so two concurrent writers can be
checked against both orders in which they could have committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

QUEUED = "Queued"
RUNNING = "Running"
DELIVERING = "Delivering"
CANCELED = "Canceled"
REJECTED = "Rejected"
STOPPED = "Stopped"
FAILED = "Failed"
COMPLETED = "Completed"
OUTCOME_UNKNOWN = "OutcomeUnknown"

#: States no writer leaves, except a reconciliation operator's correction of Completed or Failed.
TERMINAL = frozenset({CANCELED, REJECTED, STOPPED, FAILED, COMPLETED})
#: Failure codes a worker may record before cutoff 2, and after it (the destination proved them).
#: Before cutoff 2 nothing has left the process; NotDelivered there is a refused configuration or a deferral
#: budget spent (docs/protocol.md).
FAILED_BEFORE_CUTOFF_2 = frozenset({"BuildFailed", "FinalNameOccupied", "OriginalDelivered", "NotDelivered"})
FAILED_AFTER_CUTOFF_2 = frozenset({"NotDelivered", "FinalNameOccupied", "OriginalDelivered"})
#: An original Failed for one of these proved nothing was finalized, so it may be replaced.
REPLACEABLE_FAILURES = frozenset({"BuildFailed", "AttemptsExhausted", "NotDelivered"})
#: A replacement in one of these ended without delivering anything and frees the original's slot.
SLOT_FREEING = frozenset({CANCELED, REJECTED, STOPPED, FAILED})

#: The sweeper republishes a job Queued for longer than this.
SWEEP_AFTER_MINUTES = 30

#: What a status change must be proved by: the event kinds, one of which the same write records.
#: Cancellation and rejection are proved elsewhere (the request record, the policy), by no event.
PROOF = {
    (QUEUED, RUNNING): {"Claimed"},
    (RUNNING, DELIVERING): {"DeliveryAuthorized"},
    (RUNNING, STOPPED): {"Stopped", "StoppedByRecovery"},
    (RUNNING, FAILED): {"Failed", "AttemptsExhausted"},
    (RUNNING, QUEUED): {"RequeuedByRecovery"},
    (DELIVERING, COMPLETED): {"Finished", "ResolvedByRecovery"},
    (DELIVERING, FAILED): {"Finished"},
    (DELIVERING, OUTCOME_UNKNOWN): {"Finished", "ResolvedByRecovery"},
    (OUTCOME_UNKNOWN, COMPLETED): {"Reconciled"},
    (OUTCOME_UNKNOWN, FAILED): {"Reconciled"},
    (COMPLETED, FAILED): {"Corrected"},
    (FAILED, COMPLETED): {"Corrected"},
    (QUEUED, CANCELED): set(),
    (QUEUED, REJECTED): set(),
}


@dataclass
class Request:
    """One recorded cancellation click."""

    job: UUID
    requested_by: str
    outcome: str
    found_status: str
    found_attempt: UUID | None
    found_attempt_count: int


@dataclass
class Job:
    id: UUID
    tenant: UUID
    destination: UUID
    key: str
    original: UUID | None = None
    status: str = QUEUED
    version: int = 1
    attempt: UUID | None = None
    attempt_count: int = 0
    #: None, "current" or "expired".
    lease: str | None = None
    stop_request: UUID | None = None
    canceled_by: UUID | None = None
    failure: str | None = None
    #: How long ago the last wake-up was written, as the sweeper sees it.
    woken_minutes_ago: int = 0
    #: Outbox rows written for this job, each with its own message id.
    wakeups: int = 1
    sweeps: int = 0
    #: The attempt events the job's writes must have recorded, in order: (kind, attempt).
    history: list[tuple[str, UUID]] = field(default_factory=list)
    #: Attempts whose appended evidence includes a receipt of their own expected file.
    proven_attempts: set[UUID] = field(default_factory=set)
    #: What the tenant's webhook endpoint was told, in order: (status, failure code), one per outcome.
    told: list[tuple[str, str | None]] = field(default_factory=list)

    def record(self, kind: str, attempt: UUID) -> None:
        self.history.append((kind, attempt))

    def recorded(self, kind: str, attempt: UUID) -> bool:
        return (kind, attempt) in self.history

    def wake(self) -> None:
        self.woken_minutes_ago = 0
        self.wakeups += 1


@dataclass
class Model:
    """Every job and cancellation request one test created, and the rules for writing them."""

    max_attempts: int
    jobs: dict[UUID, Job] = field(default_factory=dict)
    #: Delivery keys minted by originals, per tenant.
    keys: dict[UUID, set[str]] = field(default_factory=dict)
    destinations: dict[UUID, UUID] = field(default_factory=dict)   # destination -> tenant
    requests: dict[tuple[UUID, UUID], Request] = field(default_factory=dict)   # (tenant, request id)
    #: Tenants with a webhook endpoint: each outcome of their jobs (a terminal status, or OutcomeUnknown) is
    #: told to it by the write that gives it, and nothing else is.
    notified_tenants: set[UUID] = field(default_factory=set)

    def tell(self, job: Job) -> None:
        if job.tenant in self.notified_tenants:
            job.told.append((job.status, job.failure))

    # --- creation and terms (the operator) ------------------------------------------------------

    def create(self, job_id: UUID, tenant: UUID, destination: UUID, key: str) -> str:
        if key in self.keys.setdefault(tenant, set()):
            return "KeyTaken"
        if self.destinations.get(destination) != tenant:
            return "UnknownDestination"
        self.keys[tenant].add(key)
        self.jobs[job_id] = Job(job_id, tenant, destination, key)
        return "Created"

    def create_replacement(self, job_id: UUID, tenant: UUID, original_id: UUID) -> str:
        original = self.jobs.get(original_id)
        replaceable = (
            original is not None and original.tenant == tenant and original.original is None
            and (original.status == OUTCOME_UNKNOWN
                 or (original.status == FAILED and original.failure in REPLACEABLE_FAILURES)))
        if not replaceable:
            return "NotAllowed"
        if any(j.original == original_id and (j.status not in SLOT_FREEING or j.failure == "OriginalDelivered")
               for j in self.jobs.values()):
            return "SlotTaken"
        self.jobs[job_id] = Job(job_id, tenant, original.destination, original.key, original=original_id)
        return "Created"

    def edit(self, tenant: UUID, job_id: UUID, expected_version: int, destination: UUID) -> str:
        job = self.jobs[job_id]
        if (job.tenant != tenant or job.status != QUEUED or job.version != expected_version
                or self.destinations.get(destination) != tenant):
            return "NotChanged"
        job.destination = destination
        job.version += 1
        job.wake()
        return "Changed"

    def reject(self, job_id: UUID, checked_version: int) -> bool:
        job = self.jobs[job_id]
        if job.status != QUEUED or job.version != checked_version:
            return False
        job.status = REJECTED
        self.tell(job)
        return True

    # --- the worker's attempt -------------------------------------------------------------------

    def claim(self, job_id: UUID, checked_version: int, attempt: UUID) -> str:
        job = self.jobs[job_id]
        if job.status != QUEUED or job.version != checked_version:
            return "Lost"
        job.status, job.attempt, job.lease = RUNNING, attempt, "current"
        job.attempt_count += 1
        job.record("Claimed", attempt)
        return "Claimed"

    def authorize(self, job_id: UUID, attempt: UUID, *, evidence: int = 0) -> str:
        """Cutoff 2, as the worker hears it: refusals are explained by a re-read of state and
        ownership; a Delivering row with this attempt is a committed authorization. The evidence it
        carries (the baseline) is appended first, whoever owns the job and whatever the answer."""
        job = self.jobs[job_id]
        for _ in range(evidence):
            job.record("DeliveryEvidence", attempt)
        if job.attempt != attempt:
            return "NotOwner"
        if job.status == DELIVERING:
            return "Authorized"
        if job.status != RUNNING:
            return "NotOwner"
        # The permanent reasons first: renewing cannot cure them.
        if job.stop_request is not None:
            return "StopRecorded"
        if job.original is not None and self.jobs[job.original].status == COMPLETED:
            return "OriginalCompleted"
        if job.lease != "current":
            return "LeaseLapsed"
        job.status = DELIVERING
        job.record("DeliveryAuthorized", attempt)
        return "Authorized"

    def authorize_reread(self, job_id: UUID, attempt: UUID) -> str:
        """Why a refused cutoff 2 was refused, as the worker's re-read explains it. The re-read is
        not atomic with the refusal: when the reason is gone by then (a renewal, or a correction of
        the original, landed in between), a row that is Running, owned and unstopped reads as
        LeaseLapsed, whose one renewal and one retry settle it."""
        job = self.jobs[job_id]
        if job.attempt != attempt:
            return "NotOwner"
        if job.status == DELIVERING:
            return "Authorized"
        if job.status != RUNNING:
            return "NotOwner"
        if job.stop_request is not None:
            return "StopRecorded"
        if job.original is not None and self.jobs[job.original].status == COMPLETED:
            return "OriginalCompleted"
        return "LeaseLapsed"

    def renew(self, job_id: UUID, attempt: UUID) -> str:
        """Renewal checks ownership, never expiry: a slow worker stays the owner until a takeover."""
        job = self.jobs[job_id]
        if job.attempt != attempt or job.status not in (RUNNING, DELIVERING):
            return "Lost"
        job.lease = "current"
        return "Renewed"

    def finish_stopped(self, job_id: UUID, attempt: UUID) -> str:
        job = self.jobs[job_id]
        if job.attempt != attempt or job.status != RUNNING or job.stop_request is None:
            return "NotMatched"
        self._end(job, STOPPED, None, "Stopped")
        return "Written"

    def finish_failed(self, job_id: UUID, attempt: UUID, code: str) -> str:
        job = self.jobs[job_id]
        if (job.attempt != attempt or job.status != RUNNING or code not in FAILED_BEFORE_CUTOFF_2
                or job.stop_request is not None):   # a stop request recorded first wins: the attempt stops
            return "NotMatched"
        self._end(job, FAILED, code, "Failed")
        return "Written"

    def finish_delivery(self, job_id: UUID, attempt: UUID, outcome: str, code: str | None, *,
                        receipt_proves: bool | None = None) -> str:
        """The terminal write; the receipt it carries is appended first, whether or not the write matches."""
        job = self.jobs[job_id]
        if receipt_proves is not None:
            self.append_evidence(job_id, attempt, receipt_proves)
        allowed = outcome in (COMPLETED, OUTCOME_UNKNOWN) or (outcome == FAILED and code in FAILED_AFTER_CUTOFF_2)
        if job.attempt != attempt or job.status != DELIVERING or not allowed:
            return "NotMatched"
        self._end(job, outcome, code if outcome == FAILED else None, "Finished")
        return "Written"

    def append_evidence(self, job_id: UUID, attempt: UUID, proves_own_file: bool) -> bool:
        """Evidence is appended whoever owns the job now, and never changes its state."""
        job = self.jobs[job_id]
        job.record("DeliveryEvidence", attempt)
        if proves_own_file:
            job.proven_attempts.add(attempt)
        return True

    def _end(self, job: Job, status: str, failure: str | None, kind: str) -> None:
        job.status, job.failure, job.lease = status, failure, None
        job.record(kind, job.attempt)
        self.tell(job)

    # --- the operator's cancellation ------------------------------------------------------------

    def cancel(self, tenant: UUID, job_id: UUID, request_id: UUID, requested_by: str) -> tuple[str, str | None]:
        """(reply, outcome). The job is looked up in the caller's tenant first; a request id is
        bound to its job and operator; the outcome is decided by the state found under the lock."""
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return "NotFound", None
        earlier = self.requests.get((tenant, request_id))
        if earlier is not None:
            if earlier.job != job_id or earlier.requested_by != requested_by:
                return "RequestIdReused", None
            return "Recorded", earlier.outcome
        outcome = self.classify(job)
        self.requests[(tenant, request_id)] = Request(job_id, requested_by, outcome, job.status, job.attempt,
                                                      job.attempt_count)
        if outcome == "CanceledWhileQueued":
            job.status, job.canceled_by = CANCELED, request_id
            self.tell(job)
        elif outcome == "StopRequested":
            job.stop_request = request_id
        return "Recorded", outcome

    @staticmethod
    def classify(job: Job) -> str:
        if job.status == QUEUED:
            return "CanceledWhileQueued"
        if job.status == RUNNING:
            return "StopAlreadyRequested" if job.stop_request is not None else "StopRequested"
        if job.status == CANCELED:
            return "AlreadyCanceled"
        if job.status in (REJECTED, STOPPED, FAILED):
            return "AlreadyEnded"
        return "TooLate"   # Delivering, Completed, OutcomeUnknown: delivery was authorized

    # --- recovery -------------------------------------------------------------------------------

    def expired(self) -> set[tuple[UUID, UUID]]:
        """What recovery's scan nominates: (job, attempt) of every expired lease."""
        return {(j.id, j.attempt) for j in self.jobs.values()
                if j.status in (RUNNING, DELIVERING) and j.lease == "expired"}

    def _expired_attempt(self, job: Job, attempt: UUID, status: str) -> bool:
        return job.status == status and job.attempt == attempt and job.lease == "expired"

    def requeue_expired(self, job_id: UUID, attempt: UUID) -> bool:
        job = self.jobs[job_id]
        if (not self._expired_attempt(job, attempt, RUNNING) or job.stop_request is not None
                or job.attempt_count >= self.max_attempts):
            return False
        job.status, job.attempt, job.lease = QUEUED, None, None
        job.record("RequeuedByRecovery", attempt)
        job.wake()
        return True

    def stop_expired(self, job_id: UUID, attempt: UUID) -> bool:
        job = self.jobs[job_id]
        if not self._expired_attempt(job, attempt, RUNNING) or job.stop_request is None:
            return False
        self._end(job, STOPPED, None, "StoppedByRecovery")
        return True

    def exhaust_expired(self, job_id: UUID, attempt: UUID) -> bool:
        job = self.jobs[job_id]
        if (not self._expired_attempt(job, attempt, RUNNING) or job.stop_request is not None
                or job.attempt_count < self.max_attempts):
            return False
        self._end(job, FAILED, "AttemptsExhausted", "AttemptsExhausted")
        return True

    def resolve_delivering(self, job_id: UUID, attempt: UUID, resolution: str) -> bool:
        """Recovery never concludes Failed, and never retries a delivery."""
        job = self.jobs[job_id]
        if not self._expired_attempt(job, attempt, DELIVERING) or resolution not in (COMPLETED, OUTCOME_UNKNOWN):
            return False
        self._end(job, resolution, None, "ResolvedByRecovery")
        return True

    @staticmethod
    def proves_delivery(job: Job, attempt: UUID | None = None) -> bool:
        """Completed only on the attempt's evidence of its expected file; a replacement without a
        recorded baseline can never prove it, because a file under its name may be the original's."""
        return job.original is None and (attempt or job.attempt) in job.proven_attempts

    def recovery_scan(self) -> list[tuple[UUID, UUID, str, bool, int]]:
        """Recovery's scan: it only nominates, with what it saw (state, stop request, attempt count)."""
        return [(j.id, j.attempt, j.status, j.stop_request is not None, j.attempt_count)
                for j in sorted(self.jobs.values(), key=lambda j: j.id)
                if j.status in (RUNNING, DELIVERING) and j.lease == "expired"]

    def recovery_take_over(self, nominations: list[tuple[UUID, UUID, str, bool, int]]) -> dict[str, int]:
        """The rest of a recovery run: each nomination taken over by the rule for what the scan saw
        (a Delivering one weighed on the evidence there is now), each takeover matching only if its
        conditions still hold; then every OutcomeUnknown whose attempt's evidence proves the delivery
        reconciled to Completed. Answers how many of each it wrote, and how many matched nothing."""
        counts: dict[str, int] = {}

        def count(name: str, written: bool) -> None:
            name = name if written else "not_matched"
            counts[name] = counts.get(name, 0) + 1

        for job_id, attempt, status, stop_requested, attempt_count in nominations:
            job = self.jobs[job_id]
            if status == DELIVERING:
                proven = self.proves_delivery(job, attempt)
                count("completed" if proven else "outcome_unknown",
                      self.resolve_delivering(job_id, attempt, COMPLETED if proven else OUTCOME_UNKNOWN))
            elif stop_requested:
                count("stopped", self.stop_expired(job_id, attempt))
            elif attempt_count < self.max_attempts:
                count("requeued", self.requeue_expired(job_id, attempt))
            else:
                count("exhausted", self.exhaust_expired(job_id, attempt))
        for job in self.jobs.values():
            if job.status == OUTCOME_UNKNOWN and self.proves_delivery(job):
                if self.reconcile(job.tenant, job.id, job.attempt, COMPLETED):
                    counts["reconciled"] = counts.get("reconciled", 0) + 1
        return counts

    def recovery_run(self) -> dict[str, int]:
        return self.recovery_take_over(self.recovery_scan())

    # --- the sweeper ----------------------------------------------------------------------------

    def sweep(self) -> set[UUID]:
        due = {j.id for j in self.jobs.values() if j.status == QUEUED and j.woken_minutes_ago > SWEEP_AFTER_MINUTES}
        for job_id in due:
            self.jobs[job_id].sweeps += 1
            self.jobs[job_id].wake()
        return due

    # --- after recovery: reconciliation and correction ------------------------------------------

    def reconcile(self, tenant: UUID, job_id: UUID, attempt: UUID | None, resolution: str) -> bool:
        job = self.jobs[job_id]
        if (job.tenant != tenant or attempt is None or job.attempt != attempt or job.status != OUTCOME_UNKNOWN
                or resolution not in (COMPLETED, FAILED) or job.recorded("Reconciled", attempt)):
            return False
        if resolution == COMPLETED and job.original is None and any(
                r.original == job.id and r.status in (DELIVERING, COMPLETED, OUTCOME_UNKNOWN)
                and any(kind == "DeliveryAuthorized" for kind, _ in r.history) for r in self.jobs.values()):
            return False   # a file under the shared name may be the replacement's
        job.status, job.failure = resolution, "NotDelivered" if resolution == FAILED else None
        job.record("Reconciled", attempt)
        self.tell(job)
        return True

    def correctable(self, tenant: UUID, job_id: UUID, attempt: UUID | None, recorded: str, corrected: str) -> bool:
        job = self.jobs[job_id]
        return (job.tenant == tenant and attempt is not None and job.attempt == attempt and job.status == recorded
                and recorded in (COMPLETED, FAILED) and corrected in (COMPLETED, FAILED) and corrected != recorded
                and not job.recorded("Corrected", attempt))

    def correct(self, tenant: UUID, job_id: UUID, attempt: UUID | None, recorded: str, corrected: str,
                code: str | None) -> bool:
        """Only a reconciliation operator corrects, once per attempt, Completed <-> Failed."""
        if not self.correctable(tenant, job_id, attempt, recorded, corrected):
            return False
        job = self.jobs[job_id]
        job.status, job.failure = corrected, code if corrected == FAILED else None
        job.record("Corrected", attempt)
        self.tell(job)
        return True
