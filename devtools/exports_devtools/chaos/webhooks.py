"""The chaos checker's webhook rules, for the jobs of a tenant with a webhook endpoint: every outcome the
job's history records (each terminal status, and each OutcomeUnknown) told once, in the order they
happened, by a delivery the receiver took under its id; and nothing told of a tenant without one.

- ``webhook-mismatch``: the job's webhook deliveries, in commit order, are not its outcomes: one missing
  (an outcome that told nothing), one extra (a delivery no outcome accounts for, or any for a tenant
  without an endpoint), or out of order.
- ``webhook-undelivered``: a delivery still pending or given up once the system settled, or marked
  delivered but never taken, verified, by the receiver (its id not among the ids the receiver answered
  2xx).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from app.store.types import EventKind, Status
from exports_devtools.chaos.replay import TRANSITIONS, entered

Row = dict[str, Any]

#: The statuses a delivery tells: every terminal one, and OutcomeUnknown.
OUTCOMES = frozenset({Status.COMPLETED, Status.FAILED, Status.STOPPED, Status.CANCELED, Status.REJECTED,
                      Status.OUTCOME_UNKNOWN})


def outcomes(job: Row, events: Iterable[Row]) -> list[str]:
    """The outcomes the job's events record, in order; a Canceled or Rejected job (whose transition no
    event records) ends with its status."""
    found: list[str] = []
    for event in events:
        try:
            kind = EventKind(event["kind"])
        except ValueError:
            continue   # the replay rule names it
        if kind is EventKind.DELIVERY_EVIDENCE:
            continue
        target = TRANSITIONS[kind][1] or entered(kind, event["detail"] or "")
        if target in OUTCOMES:
            found.append(target.value)
    if job["status"] in (Status.CANCELED, Status.REJECTED):
        found.append(job["status"])
    return found


def problems(job: Row, events: Sequence[Row], deliveries: Sequence[Row], notified: bool,
             received: set[str] | None) -> dict[str, str]:
    """The webhook rules this job breaks, each with why."""
    found: dict[str, str] = {}
    expected = outcomes(job, events) if notified else []
    told = [d["status"] for d in deliveries]
    if told != expected:
        found["webhook-mismatch"] = (f"outcomes {expected} but webhook deliveries {told}" if notified
                                     else f"its tenant has no webhook endpoint, yet deliveries {told}")
    stuck = [f"{d['id']} ({d['status']}) {d['state']} after {d['attempts']} attempt(s)" for d in deliveries
             if d["state"] != "delivered"]
    unseen = [] if received is None else [f"{d['id']} ({d['status']}) delivered but never taken by the receiver"
                                          for d in deliveries if d["state"] == "delivered"
                                          and str(d["id"]) not in received]
    if stuck or unseen:
        found["webhook-undelivered"] = "; ".join(stuck + unseen)
    return found
