"""The vocabulary of the protocol. Enums that mirror a CHECK constraint are compared with the
constraint itself by a test, so the two cannot drift apart."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID


class Status(enum.StrEnum):
    QUEUED = "Queued"
    RUNNING = "Running"
    DELIVERING = "Delivering"
    CANCELED = "Canceled"
    REJECTED = "Rejected"
    STOPPED = "Stopped"
    FAILED = "Failed"
    COMPLETED = "Completed"
    OUTCOME_UNKNOWN = "OutcomeUnknown"

    @property
    def is_terminal(self) -> bool:
        return self not in (Status.QUEUED, Status.RUNNING, Status.DELIVERING, Status.OUTCOME_UNKNOWN)


class EventKind(enum.StrEnum):
    CLAIMED = "Claimed"
    DELIVERY_AUTHORIZED = "DeliveryAuthorized"
    STOPPED = "Stopped"
    FAILED = "Failed"
    FINISHED = "Finished"
    REQUEUED_BY_RECOVERY = "RequeuedByRecovery"
    STOPPED_BY_RECOVERY = "StoppedByRecovery"
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
    RESOLVED_BY_RECOVERY = "ResolvedByRecovery"
    RECONCILED = "Reconciled"
    CORRECTED = "Corrected"
    DELIVERY_EVIDENCE = "DeliveryEvidence"
    DEFERRED_PARTNER_UNAVAILABLE = "DeferredPartnerUnavailable"


class FailureCode(enum.StrEnum):
    BUILD_FAILED = "BuildFailed"
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
    NOT_DELIVERED = "NotDelivered"
    FINAL_NAME_OCCUPIED = "FinalNameOccupied"
    ORIGINAL_DELIVERED = "OriginalDelivered"


class FailureCause(enum.StrEnum):
    """Why a Failed ended the way it did, beside its code, recorded in its event's detail: the retry
    policy retries only a proven non-delivery of a transient cause."""

    #: The partner could not be reached, or the connection broke: trying again later may work.
    TRANSIENT = "transient"
    #: The partner refused our configuration (its host key is not the pinned one, it rejected the
    #: credential, or the credential cannot be read): an operator must act first.
    CONFIGURATION = "configuration"
    #: Anything else: the partner refused the request, or the file was not the expected one.
    PERMANENT = "permanent"


class CancellationOutcome(enum.StrEnum):
    """What a recorded cancellation request found and did."""

    CANCELED_WHILE_QUEUED = "CanceledWhileQueued"
    STOP_REQUESTED = "StopRequested"
    STOP_ALREADY_REQUESTED = "StopAlreadyRequested"
    ALREADY_CANCELED = "AlreadyCanceled"
    ALREADY_ENDED = "AlreadyEnded"
    TOO_LATE = "TooLate"


class Role(enum.StrEnum):
    """The database roles; every connection runs under exactly one."""

    APP = "exports_app"
    DISPATCHER = "exports_dispatcher"
    RECONCILER = "exports_reconciler"
    #: Archives and deletes published outbox rows past their retention; nothing else.
    RETENTION = "exports_retention"
    #: The notifier: sends the tenants' webhooks and records each attempt; nothing else.
    NOTIFIER = "exports_notifier"


class ClaimResult(enum.Enum):
    CLAIMED = "Claimed"
    LOST = "Lost"          # another attempt claimed it, or it was canceled, edited or ended
    UNKNOWN = "Unknown"    # the write and the re-read both failed: leave the message unsettled


class AuthorizationResult(enum.Enum):
    AUTHORIZED = "Authorized"
    STOP_RECORDED = "StopRecorded"
    LEASE_LAPSED = "LeaseLapsed"
    NOT_OWNER = "NotOwner"
    ORIGINAL_COMPLETED = "OriginalCompleted"
    UNKNOWN = "Unknown"


class DeferResult(enum.Enum):
    """The answer of a deferral (Running -> Queued with a wake-up due later)."""

    DEFERRED = "Deferred"
    STOP_RECORDED = "StopRecorded"   # a stop request was recorded first: the attempt records Stopped
    LEASE_LAPSED = "LeaseLapsed"     # still the owner, but the lease expired: renew, then defer again
    NOT_OWNER = "NotOwner"           # a takeover committed or the attempt ended: write nothing more
    UNKNOWN = "Unknown"              # neither the write nor the re-read answered


class WriteResult(enum.Enum):
    """The answer of a conditional write whose loss of response is settled by re-reading the row."""

    WRITTEN = "Written"
    NOT_MATCHED = "NotMatched"   # the row was not in the state the write required: nothing changed
    UNKNOWN = "Unknown"          # neither the write nor the re-read answered


class RenewResult(enum.Enum):
    RENEWED = "Renewed"
    LOST = "Lost"          # the renewal changed no row: a takeover committed or the attempt ended
    FAILED = "Failed"      # it raised; retried at the next interval


class ReplacementResult(enum.Enum):
    CREATED = "Created"
    NOT_ALLOWED = "NotAllowed"    # original missing, another tenant's, a replacement, or not replaceable
    SLOT_TAKEN = "SlotTaken"      # uq_export_jobs_one_replacement: a live or delivered replacement exists


class EditResult(enum.Enum):
    CHANGED = "Changed"
    NOT_CHANGED = "NotChanged"    # started, ended, edited by someone else, or not this tenant's


@dataclass(frozen=True)
class Ownership:
    """State and ownership read together, for the lost-response wrappers."""

    status: Status
    attempt_id: UUID | None
    stop_requested: bool
    lease_current: bool
    original_status: Status | None


@dataclass(frozen=True)
class ExpectedFile:
    """What cutoff 2 records: the file the attempt is authorized to deliver, and what the final name
    must hold for the delivery to count."""

    name: str
    size: int
    sha256: bytes
    #: The completion marker written after the file, for a partner that ingests only complete transfers:
    #: its name and its whole content (an empty ``.done``, or the manifest), recorded with the file.
    marker_name: str | None = None
    marker: bytes | None = field(default=None, repr=False)
    #: An incremental export's: the snapshot its build read (pg_snapshot's text), the watermark its
    #: schedule's next run sends the changes since, once this one is Completed.
    snapshot: str | None = None

    def __post_init__(self) -> None:
        if len(self.sha256) != 32:
            raise ValueError("sha256 must be a 32-byte digest")
        if self.size < 0:
            raise ValueError("size must not be negative")
        if (self.marker_name is None) != (self.marker is None):
            raise ValueError("a marker has a name and a content, or neither")

    @property
    def sha256_hex(self) -> str:
        return self.sha256.hex()

    @property
    def marker_sha256_hex(self) -> str | None:
        return None if self.marker is None else hashlib.sha256(self.marker).hexdigest()

    def __repr__(self) -> str:
        return f"ExpectedFile(name={self.name!r}, size={self.size}, sha256={self.sha256.hex()[:16]}...)"


@dataclass(frozen=True)
class EditOutcome:
    result: EditResult
    version: int | None = None


class CancellationReply(enum.Enum):
    RECORDED = "Recorded"                 # the outcome is recorded (now, or by an earlier submission)
    NOT_FOUND = "NotFound"                # no such job in this tenant; another tenant's job looks the same
    REQUEST_ID_REUSED = "RequestIdReused"  # the id names another job or operator's request: a client error
    BUSY = "Busy"                         # lock_timeout fired; nothing recorded; retry with the same id


@dataclass(frozen=True)
class CancellationResult:
    reply: CancellationReply
    request_id: UUID
    outcome: CancellationOutcome | None = None
    found_status: Status | None = None
    found_attempt_id: UUID | None = None
    found_attempt_count: int | None = None
    found_delivery_authorized_at: datetime | None = None
    #: When the answer is a request already recorded (the same click again): when it was recorded.
    replay_of: datetime | None = None


@dataclass(frozen=True)
class ScheduleSlot:
    """What an export a schedule creates records about it: the schedule, the slot (its local wall-clock
    time in the schedule's zone), and for an incremental schedule the snapshot of its last Completed run
    (``since``, pg_snapshot's text; None: the first run, a full one)."""

    schedule_id: UUID
    slot: datetime
    incremental: bool = False
    since: str | None = None
