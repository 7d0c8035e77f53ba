"""Replaying one job's events from Queued, for the chaos checker's ``event-mismatch`` rule: which
state each transition may leave and enter, and where the events and the job's row disagree."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.store.types import CancellationOutcome, EventKind, FailureCode, Status

Row = dict[str, Any]

#: Each transition event: the states it may leave, and the state it enters (None: named by its detail,
#: ``Finished``, ``ResolvedByRecovery``, ``Reconciled`` and ``Corrected``).
TRANSITIONS: Mapping[EventKind, tuple[frozenset[Status], Status | None]] = {
    EventKind.CLAIMED: (frozenset({Status.QUEUED}), Status.RUNNING),
    EventKind.DELIVERY_AUTHORIZED: (frozenset({Status.RUNNING}), Status.DELIVERING),
    EventKind.STOPPED: (frozenset({Status.RUNNING}), Status.STOPPED),
    EventKind.FAILED: (frozenset({Status.RUNNING}), Status.FAILED),
    EventKind.DEFERRED_PARTNER_UNAVAILABLE: (frozenset({Status.RUNNING}), Status.QUEUED),
    EventKind.FINISHED: (frozenset({Status.DELIVERING}), None),
    EventKind.REQUEUED_BY_RECOVERY: (frozenset({Status.RUNNING}), Status.QUEUED),
    EventKind.STOPPED_BY_RECOVERY: (frozenset({Status.RUNNING}), Status.STOPPED),
    EventKind.ATTEMPTS_EXHAUSTED: (frozenset({Status.RUNNING}), Status.FAILED),
    EventKind.RESOLVED_BY_RECOVERY: (frozenset({Status.DELIVERING}), None),
    EventKind.RECONCILED: (frozenset({Status.OUTCOME_UNKNOWN}), None),
    EventKind.CORRECTED: (frozenset({Status.COMPLETED, Status.FAILED}), None),
}

#: The states each detail-named transition may enter, as its statement allows.
_DETAIL_TARGETS: Mapping[EventKind, frozenset[Status]] = {
    EventKind.FINISHED: frozenset({Status.COMPLETED, Status.FAILED, Status.OUTCOME_UNKNOWN}),
    EventKind.RESOLVED_BY_RECOVERY: frozenset({Status.COMPLETED, Status.OUTCOME_UNKNOWN}),
    EventKind.RECONCILED: frozenset({Status.COMPLETED, Status.FAILED}),
    EventKind.CORRECTED: frozenset({Status.COMPLETED, Status.FAILED}),
}

_STATUS_WORD = re.compile(r"^(?P<status>[A-Za-z]+)")
_CORRECTION = re.compile(r"^(?P<recorded>[A-Za-z]+) to (?P<corrected>[A-Za-z]+):")


def status_word(detail: str) -> Status | None:
    match = _STATUS_WORD.match(detail)
    try:
        return Status(match["status"]) if match else None
    except ValueError:
        return None


def entered(kind: EventKind, detail: str) -> Status | None:
    """The state a detail-named transition entered, or None if its detail does not name one it may."""
    if kind is EventKind.CORRECTED:
        match = _CORRECTION.match(detail)
        entered = status_word(match["corrected"]) if match else None
    else:
        entered = status_word(detail)
    return entered if entered in _DETAIL_TARGETS[kind] else None


def _failure_code(kind: EventKind, detail: str) -> str | None:
    """The failure code the event records for a Failed it entered; None when its detail does not say
    (a correction to Failed names no code in its detail)."""
    words = detail.replace(":", " ").split()
    if kind is EventKind.FAILED and words:
        return words[0]
    if kind is EventKind.FINISHED and len(words) > 1:
        return words[1]
    if kind is EventKind.ATTEMPTS_EXHAUSTED:
        return FailureCode.ATTEMPTS_EXHAUSTED.value
    if kind is EventKind.RECONCILED:
        return FailureCode.NOT_DELIVERED.value
    return None


def replay_problems(job: Row, events: Sequence[Row], cancellations: Iterable[Row]) -> list[str]:
    """Replays ``events`` (one job's, in order) from Queued and says where they and the row disagree."""
    problems: list[str] = []
    cancel = next((c for c in cancellations if c["id"] == job["cancellation_request_id"]), None)
    canceled_at = cancel["recorded_at"] if cancel is not None and job["status"] == Status.CANCELED else None
    status, attempt, code = Status.QUEUED, None, None
    claims = deferrals = 0
    for event in events:
        try:
            kind = EventKind(event["kind"])
        except ValueError:
            problems.append(f"event {event['id']}: unknown kind {event['kind']!r}")
            continue
        if kind is EventKind.DELIVERY_EVIDENCE:
            continue
        where = f"event {event['id']} {kind.value}"
        if canceled_at is not None and event["recorded_at"] > canceled_at:
            problems.append(f"{where} after the job was canceled at {canceled_at}")
        leaves, enters = TRANSITIONS[kind]
        detail = event["detail"] or ""
        if status not in leaves:
            after = "follows the terminal state" if status.is_terminal else "from"
            problems.append(f"{where} {after} {status.value}")
        if kind is EventKind.CLAIMED:
            attempt = event["attempt_id"]
            claims += 1
        elif event["attempt_id"] != attempt:
            problems.append(f"{where} by attempt {event['attempt_id']}, but the job's attempt is {attempt}")
        target = enters if enters is not None else entered(kind, detail)
        if target is None:
            problems.append(f"{where} names no state it may enter ({detail!r})")
            continue
        if target is Status.FAILED:
            code = _failure_code(kind, detail)
        status = target
        if kind is EventKind.DEFERRED_PARTNER_UNAVAILABLE:
            deferrals += 1
        if status is Status.QUEUED:
            attempt = None   # a requeue and a deferral clear the attempt; terminal states keep it
    recorded = Status(job["status"])
    if recorded is Status.CANCELED:
        if cancel is None or cancel["outcome"] != CancellationOutcome.CANCELED_WHILE_QUEUED:
            problems.append("Canceled without its CanceledWhileQueued request "
                            f"(cancellation_request_id {job['cancellation_request_id']})")
    if recorded in (Status.CANCELED, Status.REJECTED):
        if status is not Status.QUEUED:
            problems.append(f"row {recorded.value}, but the events leave it {status.value}, not Queued")
    elif recorded is not status:
        problems.append(f"row {recorded.value}, but the events leave it {status.value}")
    if job["attempt_id"] != attempt and recorded is status:
        problems.append(f"row attempt {job['attempt_id']}, but the events leave attempt {attempt}")
    if job["attempt_count"] != claims:
        problems.append(f"attempt_count {job['attempt_count']}, but {claims} Claimed event(s)")
    if job["deferrals"] != deferrals:
        problems.append(f"deferrals {job['deferrals']}, but {deferrals} DeferredPartnerUnavailable event(s)")
    if recorded is Status.FAILED and status is Status.FAILED and code is not None and job["failure_reason"] != code:
        problems.append(f"failure_reason {job['failure_reason']}, but the events record {code}")
    if recorded is Status.STOPPED and job["stop_request_id"] is None:
        problems.append("Stopped with no stop request recorded")
    return problems
