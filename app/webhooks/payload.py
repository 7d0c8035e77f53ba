"""The body a receiver gets: one JSON object per event, rendered the same way every time from a delivery
and the job's facts its outcome fixed (key, file name, bytes, sha256), so every retry of an event
sends the same bytes under the same ``webhook-id``.

    {"type": "export.completed", "timestamp": "2026-12-03T10:15:02.118204Z",
     "data": {"event_id": "...", "export_id": "...", "tenant_id": "...", "delivery_key": "...",
              "status": "Completed", "failure_reason": null, "recorded_by": "worker",
              "file_name": "contacts-....csv", "bytes": 48213, "sha256": "9f2c...",
              "attempt_id": "...", "attempt_number": 1, "replaces_export_id": null,
              "schedule_id": null, "slot": null, "occurred_at": "2026-12-03T10:15:02.118204Z"}}

The envelope (``type``, ``timestamp``, ``data``) is the Standard Webhooks one. ``schedule_id`` and
``slot`` are null for an export created by hand: they name the schedule and fire time of an export a
schedule created. A receiver must ignore fields it does not know; new ones may be added.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from app.store.webhooks import Claimed

#: The event type of each outcome.
EVENT_TYPES = {
    "Completed": "export.completed",
    "Failed": "export.failed",
    "Stopped": "export.stopped",
    "Canceled": "export.canceled",
    "Rejected": "export.rejected",
    "OutcomeUnknown": "export.outcome_unknown",
}
#: The type of ``exports webhook test``'s request.
PROBE_TYPE = "webhook.test"


def _instant(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _id(value: UUID | None) -> str | None:
    return None if value is None else str(value)


def render(envelope: dict[str, Any]) -> bytes:
    """Compact JSON in the order given: the same object gives the same bytes."""
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def event(delivery: Claimed) -> dict[str, Any]:
    """The event as a receiver reads it."""
    occurred = _instant(delivery.occurred_at)
    return {
        "type": EVENT_TYPES[delivery.status],
        "timestamp": occurred,
        "data": {
            "event_id": str(delivery.id),
            "export_id": str(delivery.job_id),
            "tenant_id": str(delivery.tenant_id),
            "delivery_key": delivery.delivery_key,
            "status": delivery.status,
            "failure_reason": delivery.failure_reason,
            "recorded_by": delivery.source,
            "file_name": delivery.file_name,
            "bytes": delivery.expected_file_bytes,
            "sha256": None if delivery.expected_file_sha256 is None else delivery.expected_file_sha256.hex(),
            "attempt_id": _id(delivery.attempt_id),
            "attempt_number": delivery.attempt_count if delivery.attempt_id is not None else None,
            "replaces_export_id": _id(delivery.replaces_job_id),
            # Null until exports record the schedule and fire time that created them: then they are read
            # with the job's other facts in webhooks_claim_batch (and granted to exports_notifier) and
            # rendered here.
            "schedule_id": None,
            "slot": None,
            "occurred_at": occurred,
        },
    }


def body(delivery: Claimed) -> bytes:
    return render(event(delivery))


def probe(event_id: UUID, tenant_id: UUID, endpoint_id: UUID, endpoint_name: str, sent_at: datetime) -> bytes:
    """What ``exports webhook test`` sends: a signed request of its own type, no export's event."""
    return render({"type": PROBE_TYPE, "timestamp": _instant(sent_at),
                   "data": {"event_id": str(event_id), "tenant_id": str(tenant_id), "endpoint_id": str(endpoint_id),
                            "endpoint_name": endpoint_name}})
