"""Recovery's and reconciliation's looks at a partner's destination: the final name an expired delivery
should have written, and the completion marker it may have to finish, each on the job's destination as
its row describes it now, in the delivery mode its attempt's cutoff 2 recorded (a mode that allows no
look is never looked at: the answer is then no listing at all)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from app.delivery.config import DestinationConfig
from app.delivery.destination import Destination
from app.delivery.evidence import Listing
from app.delivery.modes import DeliveryMode
from app.store import directory
from app.store.database import Database
from app.store.recovery import ExpiredAttempt, UnknownOutcome
from app.store.types import ExpectedFile

InspectDestination = Callable[[ExpiredAttempt], "Listing | None"]
#: Writes an attempt's missing completion marker where its file is there as recorded (for an expired
#: Delivering attempt or an OutcomeUnknown one), and answers what the destination shows then.
FinishMarker = Callable[["ExpiredAttempt | UnknownOutcome", ExpectedFile], "Listing | None"]


def _destination(db: Database, job: ExpiredAttempt | UnknownOutcome) -> Destination | None:
    """The job's destination as its row describes it now, in the mode the attempt recorded; None when
    there is no row, or the mode allows no look."""
    if job.destination_id is None:
        return None
    with db.connection() as conn:
        row = directory.read_destination(conn, tenant_id=job.tenant_id, destination_id=job.destination_id)
    if row is None:
        return None
    mode = DeliveryMode.of(job.expected_delivery_mode)
    if not mode.looks:
        return None
    return Destination(dataclasses.replace(DestinationConfig.from_row(row), delivery_mode=mode))


class DestinationInspector:
    """The default ``inspect_destination``: lists the expected final name (and its marker) on the job's
    destination. None when there is nothing to look at, or the mode allows no look."""

    def __init__(self, db: Database):
        self.db = db

    def __call__(self, job: ExpiredAttempt) -> Listing | None:
        if job.expected_file_name is None:
            return None
        destination = _destination(self.db, job)
        if destination is None:
            return None
        return destination.inspect(job.expected_file_name, marker_name=job.expected_marker_name)


class MarkerFinisher:
    """The default ``finish_marker``: ``Destination.complete_marker`` on the job's destination."""

    def __init__(self, db: Database):
        self.db = db

    def __call__(self, job: ExpiredAttempt | UnknownOutcome, expected: ExpectedFile) -> Listing | None:
        if job.attempt_id is None:
            return None
        destination = _destination(self.db, job)
        if destination is None:
            return None
        return destination.complete_marker(expected, str(job.attempt_id))
