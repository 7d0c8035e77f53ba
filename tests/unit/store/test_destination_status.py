"""``destination status``'s last error is the newer of the circuit's last connection error and the newest
failed export's cause."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from app.store.partner import DestinationStatus

T = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _status(last_error=None, updated_at=None, last_failure=None, last_failure_at=None) -> DestinationStatus:
    return DestinationStatus(id=uuid.uuid4(), tenant_name="t", name="d", host="h", port=22, active=True,
                             max_sessions=4, auto_retries=3, state="closed", opened_at=None, next_probe_at=None,
                             failures=0, last_error=last_error, updated_at=updated_at, sessions_in_use=0,
                             deferred_jobs=0, last_failure=last_failure, last_failure_at=last_failure_at)


def test_a_failure_newer_than_the_circuits_error_is_the_last_error():
    status = _status("connecting: refused", T, "NotDelivered (configuration): auth", T + timedelta(seconds=1))
    assert status.latest_error == "NotDelivered (configuration): auth"


def test_a_connection_error_newer_than_the_last_failure_is_the_last_error():
    status = _status("connecting: refused", T, "NotDelivered (configuration): auth", T - timedelta(hours=1))
    assert status.latest_error == "connecting: refused"


def test_either_alone_is_the_last_error_and_neither_is_none():
    assert _status(last_failure="BuildFailed", last_failure_at=T).latest_error == "BuildFailed"
    assert _status("connecting: refused", T).latest_error == "connecting: refused"
    assert _status().latest_error is None
