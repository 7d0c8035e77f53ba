"""The export policy: reads and decides, nothing more.

A duplicate wake-up repeats this evaluation, so it must be free of side effects: it never writes, and
nothing it does needs to happen exactly once. The runner records a refusal with ``jobs.reject`` for
the evaluated version only.

It decides two things: whether the job may run at all (its destination exists in the job's tenant
and is active), and the scope of what it may export (only contacts who consented).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from uuid import UUID

import psycopg

from app.actors.destination import DestinationConfig, DestinationError
from app.store.queries import QUERIES
from app.store.types import ExpectedFile, Status

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class JobView:
    id: UUID
    tenant_id: UUID
    status: Status
    version: int
    destination_id: UUID
    delivery_key: str
    replaces_job_id: UUID | None
    overwrite_agreement_ref: str | None


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


def read_job(conn: psycopg.Connection, job_id: UUID) -> JobView | None:
    row = conn.execute(QUERIES["worker_read_job"], dict(job_id=job_id)).fetchone()
    if row is None:
        return None
    return JobView(id=row["id"], tenant_id=row["tenant_id"], status=Status(row["status"]), version=row["version"],
                   destination_id=row["destination_id"], delivery_key=row["delivery_key"],
                   replaces_job_id=row["replaces_job_id"], overwrite_agreement_ref=row["overwrite_agreement_ref"])


def read_original_expected(conn: psycopg.Connection, job: JobView) -> ExpectedFile | None:
    """The original's expected file, or None for an original job or an original that never reached
    cutoff 2 (then nothing can identify a file as its delivery)."""
    if job.replaces_job_id is None:
        return None
    row = conn.execute(QUERIES["worker_read_original_expected"], dict(tenant_id=job.tenant_id,
                                                    original_job_id=job.replaces_job_id)).fetchone()
    if row is None or row["expected_file_name"] is None or row["expected_file_sha256"] is None:
        return None
    return ExpectedFile(row["expected_file_name"], row["expected_file_bytes"], bytes(row["expected_file_sha256"]))


class ExportPolicy:
    """Side-effect free: reads on the caller's connection and returns a decision."""

    def evaluate(self, conn: psycopg.Connection, job: JobView) -> Decision:
        row = conn.execute(QUERIES["worker_read_destination"], dict(tenant_id=job.tenant_id,
                                                  destination_id=job.destination_id)).fetchone()
        if row is None:
            return Decision(Refusal.DESTINATION_MISSING)
        if not row["active"]:
            return Decision(Refusal.DESTINATION_INACTIVE)
        try:
            config = DestinationConfig(
                host=row["host"], port=row["port"], username=row["username"], remote_dir=row["remote_dir"],
                host_key=row["host_key"], credential_ref=row["credential_ref"], remote_hash=row["remote_hash"],
                acknowledgments=row["acknowledgments"], name_and_size_identify=row["name_and_size_identify"],
                read_back=row["read_back"])
        except (ValueError, DestinationError) as exc:
            log.warning("policy.destination_unusable destination_id=%s error=%s", job.destination_id, exc)
            return Decision(Refusal.DESTINATION_UNUSABLE)
        return Decision(None, scope=Scope.CONSENTING_CONTACTS, destination=config)
