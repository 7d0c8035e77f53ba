"""Webhooks: a tenant's endpoints, and the notifier's side of the deliveries the outcome statements insert.

One function per named statement in ``sql/webhooks.sql``, the connection first, a typed answer. The
deliveries are not written here: every statement that gives an export its outcome inserts them itself,
in the same statement (``export.sql``, ``recovery.sql``, ``cancellation.sql``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store import connector, errors
from app.store.errors import StoreError, Violation


class DeliveryState(enum.StrEnum):
    """Where a delivery is in its sending (``webhook_deliveries.state``, a CHECK a test compares)."""

    #: Owed: due at ``next_attempt_at`` (or leased to a notifier until then).
    PENDING = "pending"
    #: The receiver answered 2xx.
    DELIVERED = "delivered"
    #: Given up: the give-up horizon passed with no 2xx. Kept, with every attempt, for a person.
    DEAD = "dead"
    #: Its endpoint was removed before it was delivered.
    DROPPED = "dropped"


class Source(enum.StrEnum):
    """Which writer gave the export the outcome (``webhook_deliveries.source``)."""

    WORKER = "worker"
    RECOVERY = "recovery"
    RECONCILIATION = "reconciliation"
    CORRECTION = "correction"
    CANCELLATION = "cancellation"
    POLICY = "policy"


class AddResult(enum.Enum):
    ADDED = "Added"
    NAME_TAKEN = "NameTaken"
    UNKNOWN_TENANT = "UnknownTenant"


@dataclass(frozen=True)
class NewEndpoint:
    tenant_id: UUID
    name: str
    url: str
    #: ``env:NAME`` or ``file:/path``: where the signing secret is, never the secret.
    secret_ref: str
    created_by: str
    #: Plain http allowed (a loopback receiver only; the command checks the host).
    allow_http: bool = False


@dataclass(frozen=True)
class Endpoint:
    id: UUID
    tenant_id: UUID
    name: str
    url: str
    allow_http: bool
    secret_ref: str
    created_by: str
    created_at: datetime


@dataclass(frozen=True)
class EndpointSummary:
    endpoint: Endpoint
    tenant_name: str
    pending: int
    #: When the oldest event still owed to it happened; None when nothing is owed.
    oldest_pending: datetime | None
    dead: int
    newest_event: datetime | None
    #: The answer to the newest request for it: ``HTTP 204``, ``timed out``...; None before any.
    last_result: str | None


@dataclass(frozen=True)
class RecentDelivery:
    id: UUID
    job_id: UUID
    status: str
    failure_reason: str | None
    source: str
    occurred_at: datetime
    state: str
    attempts: int
    next_attempt_at: datetime
    finished_at: datetime | None
    last_result: str | None


@dataclass(frozen=True)
class GivenUp:
    """A dead delivery, as ``webhook redeliver`` lists what it sends again."""
    id: UUID
    job_id: UUID
    status: str
    occurred_at: datetime


@dataclass(frozen=True)
class Claimed:
    """A delivery leased to this notifier, with what its request needs. ``removed``: its endpoint was
    removed, and the claim dropped it instead; nothing is to be sent."""

    id: UUID
    endpoint_id: UUID
    tenant_id: UUID
    job_id: UUID
    attempt_id: UUID | None
    status: str
    failure_reason: str | None
    source: str
    occurred_at: datetime
    #: This claim's number: the request's attempt, recorded under it.
    attempt: int
    removed: bool
    endpoint_name: str
    url: str
    secret_ref: str
    delivery_key: str | None
    #: The job's claims so far: the number of the attempt that ended it, where one did.
    attempt_count: int | None
    expected_file_bytes: int | None
    expected_file_sha256: bytes | None
    replaces_job_id: UUID | None
    file_name: str | None


_ENDPOINT_COLUMNS = ("id", "tenant_id", "name", "url", "allow_http", "secret_ref", "created_by", "created_at")


def _endpoint(row: dict) -> Endpoint:
    return Endpoint(**{c: row[c] for c in _ENDPOINT_COLUMNS})


def add_endpoint(conn: psycopg.Connection, *, endpoint_id: UUID, endpoint: NewEndpoint) -> AddResult:
    try:
        rows = connector.execute(conn, "webhooks_add_endpoint", dict(
            endpoint_id=endpoint_id, tenant_id=endpoint.tenant_id, name=endpoint.name, url=endpoint.url,
            allow_http=endpoint.allow_http, secret_ref=endpoint.secret_ref, created_by=endpoint.created_by))
    except (psycopg.errors.UniqueViolation, psycopg.errors.ForeignKeyViolation) as exc:
        found = errors.violation(exc)
        if found is Violation.WEBHOOK_NAME_TAKEN:
            return AddResult.NAME_TAKEN
        if found is Violation.UNKNOWN_TENANT:
            return AddResult.UNKNOWN_TENANT
        raise
    if rows != 1:
        raise StoreError(f"webhooks_add_endpoint wrote {rows} rows")
    return AddResult.ADDED


def remove_endpoint(conn: psycopg.Connection, *, tenant_id: UUID, endpoint_id: UUID, removed_by: str) -> bool:
    """False when the tenant has no such live endpoint (removed already, or another tenant's)."""
    return connector.execute(conn, "webhooks_remove_endpoint", dict(
        tenant_id=tenant_id, endpoint_id=endpoint_id, removed_by=removed_by)) == 1


def list_endpoints(conn: psycopg.Connection, *, tenant_id: UUID | None = None) -> list[EndpointSummary]:
    return [EndpointSummary(endpoint=_endpoint(r), tenant_name=r["tenant_name"], pending=r["pending"],
                            oldest_pending=r["oldest_pending"], dead=r["dead"], newest_event=r["newest_event"],
                            last_result=r["last_result"])
            for r in connector.fetch_all(conn, "webhooks_list_endpoints", dict(tenant_id=tenant_id))]


def find_endpoints(conn: psycopg.Connection, *, tenant_id: UUID, endpoint_id: UUID | None = None,
                   name: str | None = None) -> list[Endpoint]:
    """The tenant's live endpoint with this id or this name (two when a name is ambiguous: never, while
    ``uq_webhook_endpoints_live_name`` holds)."""
    return [_endpoint(r) for r in connector.fetch_all(conn, "webhooks_find_endpoint", dict(
        tenant_id=tenant_id, endpoint_id=endpoint_id, name=name))]


def recent_deliveries(conn: psycopg.Connection, *, endpoint_id: UUID, limit: int) -> list[RecentDelivery]:
    return [RecentDelivery(**r) for r in connector.fetch_all(
        conn, "webhooks_recent_deliveries", dict(endpoint_id=endpoint_id, limit=limit))]


def claim_batch(conn: psycopg.Connection, *, batch_size: int, lease_seconds: float) -> list[Claimed]:
    """Leases up to ``batch_size`` due deliveries to the caller (and drops those of removed endpoints),
    committed when it returns on an autocommit connection. A reply lost here leaves the claimed rows
    leased, unsent, until the lease ends; then they are due again."""
    rows = connector.fetch_all(conn, "webhooks_claim_batch", dict(batch_size=batch_size,
                                                                  lease_seconds=lease_seconds))
    return [Claimed(**{**r, "expected_file_sha256": None if r["expected_file_sha256"] is None
                       else bytes(r["expected_file_sha256"])}) for r in rows]


def record_attempt(conn: psycopg.Connection, *, delivery_id: UUID, attempt: int, sender: str,
                   started_at: datetime, http_status: int | None, error: str | None, delivered: bool,
                   retry_in_seconds: float, give_up_seconds: float) -> DeliveryState | None:
    """Records the request and moves the delivery on; its new state, or None when this claim no longer
    holds it (its lease ended and another notifier claimed it again: the attempt is recorded all the
    same, and that notifier decides). A reply lost here is not retried: the delivery stays leased until
    its lease ends and is then sent again, under the same id, which the receiver deduplicates on."""
    row = connector.fetch_one(conn, "webhooks_record_attempt", dict(
        delivery_id=delivery_id, attempt=attempt, sender=sender, started_at=started_at, http_status=http_status,
        error=error, delivered=delivered, retry_in_seconds=retry_in_seconds, give_up_seconds=give_up_seconds))
    return None if row is None else DeliveryState(row["state"])


def release(conn: psycopg.Connection, claimed: list[Claimed]) -> int:
    """Hands back deliveries this notifier claimed and will not send (it is stopping); how many it could."""
    return connector.execute(conn, "webhooks_release", dict(delivery_ids=[c.id for c in claimed],
                                                             attempts=[c.attempt for c in claimed]))


def dead_deliveries(conn: psycopg.Connection, *, tenant_id: UUID, endpoint_id: UUID,
                    since: datetime | None) -> list[GivenUp]:
    """The endpoint's given-up deliveries since ``since`` (every one when None), oldest first."""
    return [GivenUp(id=r["id"], job_id=r["job_id"], status=r["status"], occurred_at=r["occurred_at"])
            for r in connector.fetch_all(conn, "webhooks_dead_deliveries", dict(
                tenant_id=tenant_id, endpoint_id=endpoint_id, since=since))]


def redeliver(conn: psycopg.Connection, *, tenant_id: UUID, endpoint_id: UUID, since: datetime | None,
              revived_by: str) -> list[GivenUp]:
    """Makes the endpoint's dead deliveries since ``since`` pending again, due now, under their ids; the
    ones it revived (none when the endpoint was removed meanwhile, or another operator revived them
    first: only a dead delivery is revived, so a second call finds nothing to do)."""
    rows = connector.fetch_all(conn, "webhooks_redeliver", dict(
        tenant_id=tenant_id, endpoint_id=endpoint_id, since=since, revived_by=revived_by))
    return sorted((GivenUp(id=r["id"], job_id=r["job_id"], status=r["status"], occurred_at=r["occurred_at"])
                   for r in rows), key=lambda g: (g.occurred_at, str(g.id)))
