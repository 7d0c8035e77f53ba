"""The export policy: reads and decides, nothing more.

A duplicate wake-up repeats this evaluation, so it must be free of side effects: it never writes, and
nothing it does needs to happen exactly once. The runner records a refusal with ``export.reject`` for
the evaluated version only.

It decides two things: whether the job may run at all (its destination exists in the job's tenant
and is active), and the scope of what it may export (only contacts who consented).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from app import logs
from app.delivery.config import DestinationConfig
from app.delivery.errors import DestinationError
from app.store.worker import JobView

log = logs.get(__name__)


class Scope(enum.Enum):
    """What an allowed export may contain."""

    CONSENTING_CONTACTS = "ConsentingContacts"


class Refusal(enum.Enum):
    DESTINATION_MISSING = "DestinationMissing"
    DESTINATION_INACTIVE = "DestinationInactive"
    #: The row cannot describe a delivery (say, an unparseable pinned host key): no attempt could
    #: ever deliver it, so retrying the message would only delay the answer.
    DESTINATION_UNUSABLE = "DestinationUnusable"


@dataclass(frozen=True)
class Decision:
    refusal: Refusal | None
    scope: Scope | None = None
    destination: DestinationConfig | None = None

    @property
    def allowed(self) -> bool:
        return self.refusal is None


class ExportPolicy:
    """Side-effect free: decides on what the runner read with the job (its destination's row), reading
    nothing more and writing nothing."""

    def evaluate(self, job: JobView) -> Decision:
        row = job.destination
        if row is None:
            return Decision(Refusal.DESTINATION_MISSING)
        if not row["active"]:
            return Decision(Refusal.DESTINATION_INACTIVE)
        try:
            config = DestinationConfig.from_row(row)
        except (ValueError, DestinationError) as exc:
            log.warning("policy.destination_unusable", destination_id=job.destination_id, error=exc)
            return Decision(Refusal.DESTINATION_UNUSABLE)
        return Decision(None, scope=Scope.CONSENTING_CONTACTS, destination=config)
