"""Delivery outcomes, and the classifier that turns an interrupted delivery into one.

An upload that stops part way is a question, not an answer: the final name may or may not have
been written. The classifier answers Failed only on proof that this attempt never wrote the final
name, and OutcomeUnknown otherwise, so recovery and reconciliation can settle it from evidence.

A Failed outcome carries the store's ``FailureCode`` as the terminal write records it, limited to
the codes a delivery can end with, and the ``FailureCause`` of it (``cause_of``): a partner that could
not be reached, or a connection that broke, is transient; a host key that is not the pinned one, a
rejected or unreadable credential is configuration; a refusal by the server is permanent. The runner
writes both as they come; the retry policy retries only a transient non-delivery.
"""

from __future__ import annotations

import enum
import errno
import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from app.delivery.credentials import redact as redact_secrets
from app.delivery.errors import CredentialError, HostKeyMismatch
from app.delivery.evidence import Listing, Receipt
from app.delivery.modes import DeliveryMode
from app.store.types import FailureCause, FailureCode, Status

#: Longest exception text kept in an outcome's detail, in characters; details land in a text column.
MAX_DETAIL_CHARS = 300
#: The failure codes a delivery itself can end with; the others belong to the build and to recovery.
DELIVERY_FAILURE_CODES = frozenset(
    {FailureCode.NOT_DELIVERED, FailureCode.FINAL_NAME_OCCUPIED, FailureCode.ORIGINAL_DELIVERED}
)


class Stage(enum.Enum):
    """Where a delivery was when it stopped; what it proves depends on it."""

    #: No SFTP session yet: nothing was sent, so nothing can have been written.
    CONNECT = "connect"
    #: Listing the final name before uploading: only reads were sent.
    BASELINE = "baseline"
    #: Writing the temporary name: the rename was never sent.
    UPLOAD = "upload"
    #: The rename was sent: the server may have performed it, whatever we heard back.
    RENAME = "rename"
    #: The rename succeeded; reading back what the destination shows failed.
    CONFIRM = "confirm"
    #: Mode no-rename: the completion marker's exclusive create was sent, the step that publishes the file.
    MARKER = "marker"
    #: The caller does not know (an interrupt that escaped the destination).
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Completed:
    """The delivery condition agreed with the partner was met, on the evidence in the receipt."""

    receipt: Receipt
    status: str = "Completed"


@dataclass(frozen=True)
class Failed:
    """This attempt proved it never wrote the final name; code says why it stopped."""

    code: FailureCode
    detail: str
    #: Why it failed, beside its code: only a transient cause is retried automatically.
    cause: FailureCause = FailureCause.PERMANENT
    status: str = "Failed"

    def __post_init__(self) -> None:
        if self.code not in DELIVERY_FAILURE_CODES:
            raise ValueError(f"a delivery cannot fail with {self.code.value}")


@dataclass(frozen=True)
class Unknown:
    """The final name may have been written; only evidence can settle it (OutcomeUnknown)."""

    detail: str
    status: str = "OutcomeUnknown"


DeliveryOutcome = Completed | Failed | Unknown

def terminal_write(outcome: DeliveryOutcome) -> tuple[Status, FailureCode | None, str | None, FailureCause | None]:
    """What the attempt's terminal write records for an outcome: the status, the failure code, the
    detail and, for a Failed, its cause class."""
    match outcome:
        case Completed(receipt=receipt):
            return Status.COMPLETED, None, f"proof={receipt.proof.value}", None
        case Failed(code=code, detail=detail, cause=cause):
            return Status.FAILED, code, detail[:MAX_DETAIL_CHARS], cause
        case Unknown(detail=detail):
            return Status.OUTCOME_UNKNOWN, None, detail[:MAX_DETAIL_CHARS], None
    raise AssertionError(f"unexpected delivery outcome {outcome!r}")


def outcome_evidence(outcome: DeliveryOutcome, attempt_id: object) -> str:
    """The attempt's own account of its delivery, appended as evidence even when its terminal write
    matches nothing."""
    payload: dict[str, object] = {"stage": "outcome", "attempt_id": str(attempt_id), "outcome": outcome.status}
    match outcome:
        case Completed(receipt=receipt):
            payload["receipt"] = json.loads(receipt.to_detail())
        case Failed(code=code, detail=detail, cause=cause):
            payload.update(code=code.value, detail=detail, cause=cause.value)
        case Unknown(detail=detail):
            payload["detail"] = detail
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)


# Stages at which no request that writes anything had been sent.
_NOTHING_WRITTEN = frozenset({Stage.CONNECT, Stage.BASELINE})


def classify(
    exc: BaseException,
    *,
    stage: Stage,
    baseline: Listing | None = None,
    fresh: Listing | None = None,
    rename_refused: bool = False,
    redact: Iterable[str] = (),
    mode: DeliveryMode = DeliveryMode.STANDARD,
) -> DeliveryOutcome:
    """Classify an exception raised while delivering.

    Failed(NotDelivered) needs proof that the final name was never written by this attempt:
    - it stopped before any write was sent (connect, baseline), or
    - it stopped before the rename was sent, or the server answered the rename with a refusal
      (``rename_refused``), and a fresh listing taken afterwards still matches the baseline.
    Everything else is Unknown, in particular a rename whose reply was lost (the server may have
    performed it: a blind retry cannot tell), timeouts, cut connections and cancellation
    (BaseException such as a shutdown or time limit) once the rename may have been sent.

    ``redact`` lists strings that must never appear in the detail (the resolved secret), as a
    second line of defence: the destination's own messages never contain them.

    In mode no-stat no listing can be taken: there the rename's own answer decides. Before the rename was
    sent, or when the server answered it with a refusal, this attempt put nothing under the final name
    (Failed); a rename without an answer is Unknown.
    """
    what = describe(exc, redact=redact)
    if not isinstance(exc, Exception):
        # A shutdown or time limit arriving somewhere inside the upload: we cannot know where.
        if stage in _NOTHING_WRITTEN:
            return Failed(FailureCode.NOT_DELIVERED, f"interrupted before any write at {stage.value}: {what}",
                          FailureCause.TRANSIENT)
        return Unknown(f"interrupted at {stage.value}: {what}")
    if stage in _NOTHING_WRITTEN:
        return Failed(FailureCode.NOT_DELIVERED, f"no write was sent ({stage.value}): {what}", cause_of(exc))
    if not mode.looks and stage is Stage.UPLOAD:
        return Failed(FailureCode.NOT_DELIVERED, f"upload failed, the rename never sent (mode {mode.value}): {what}",
                      cause_of(exc))
    if not mode.looks and stage is Stage.RENAME and rename_refused:
        return Failed(FailureCode.NOT_DELIVERED, f"the server refused the rename (mode {mode.value} cannot look "
                                                 f"why; a file may hold the final name): {what}",
                      FailureCause.PERMANENT)
    rename_never_ran = stage is Stage.UPLOAD or (stage is Stage.RENAME and rename_refused)
    if rename_never_ran:
        if baseline is not None and fresh is not None and fresh.same_as(baseline):
            return Failed(
                FailureCode.NOT_DELIVERED,
                f"{stage.value} failed and a fresh listing matches the baseline: {what}",
                FailureCause.PERMANENT if rename_refused else cause_of(exc),
            )
        if fresh is None:
            return Unknown(f"{stage.value} failed and no fresh listing could be taken: {what}")
        return Unknown(f"{stage.value} failed and the final name changed from the baseline: {what}")
    return Unknown(f"{stage.value} interrupted, the final name may have been written: {what}")


def cause_of(exc: BaseException) -> FailureCause:
    """Why the partner could not be used, from the error alone.

    Configuration: the server's host key is not the pinned one, it rejected the credential, or the
    credential cannot be read. Permanent: the server answered a request with a failure status.
    Transient: everything that says the connection could not be made or did not last (refused, reset,
    dropped during the banner or key exchange, as OpenSSH's MaxStartups does, timed out, closed).
    """
    if isinstance(exc, (HostKeyMismatch, paramiko.BadHostKeyException, paramiko.AuthenticationException,
                        CredentialError)):
        return FailureCause.CONFIGURATION
    if isinstance(exc, (NoValidConnectionsError, ConnectionError, TimeoutError, EOFError, paramiko.SSHException)):
        return FailureCause.TRANSIENT
    if is_status_reply(exc):
        return FailureCause.PERMANENT
    # Any other socket error (no route, network down) carries its errno.
    return FailureCause.TRANSIENT if isinstance(exc, OSError) else FailureCause.PERMANENT


def is_status_reply(exc: BaseException) -> bool:
    """True for the error paramiko raises when the server answered a request with a failure status.

    paramiko turns a status into a plain OSError (errno None), FileNotFoundError or PermissionError;
    a broken or silent connection raises TimeoutError, ConnectionError, EOFError or SSHException,
    which say nothing about what the server did.
    """
    return (
        isinstance(exc, OSError)
        and not isinstance(exc, (TimeoutError, ConnectionError))
        and exc.errno in (None, errno.ENOENT, errno.EACCES)
    )


def describe(exc: BaseException, *, redact: Iterable[str] = ()) -> str:
    """A short, secret-free description of an exception for an outcome's detail or a log."""
    name = "Timeout" if isinstance(exc, (socket.timeout, TimeoutError)) else type(exc).__name__
    text = redact_secrets(str(exc), redact)
    if len(text) > MAX_DETAIL_CHARS:
        text = text[:MAX_DETAIL_CHARS] + "..."
    return f"{name}: {text}" if text else name
