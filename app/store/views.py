"""The operator's reads: tenants, destinations, grants and exports as the ``exports`` commands show them.

Ad-hoc reads are peewee queries on the models of ``app.store.models``, which are bound to no database:
each query here is bound, on its own, to the database its ``Views`` was opened with, so nothing reads
through a connection that some other code set up, and no model class changes. That database is read-only twice over: its
connections run under a role (``SET ROLE``) with ``default_transaction_read_only`` on, and only
SELECTs are built here. Answers are frozen dataclasses; "no such row" is None or an empty list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import peewee
import psycopg
from psycopg import sql

from app.store import models
from app.store.database import CONNECT_TIMEOUT_SECONDS
from app.store.types import Role, Status

_Row = TypeVar("_Row")


@dataclass(frozen=True)
class Tenant:
    id: UUID
    name: str


@dataclass(frozen=True)
class Destination:
    id: UUID
    tenant_id: UUID
    name: str
    #: Sessions the partner allows at once (each attempt holds one from connecting to closing).
    max_sessions: int
    #: Automatic retries of a proven non-delivery per delivery key; 0: off.
    auto_retries: int


@dataclass(frozen=True)
class Grant:
    """An operator's access to one tenant; ``reconciliation`` also allows corrections."""

    operator_id: str
    tenant_id: UUID
    reconciliation: bool


@dataclass(frozen=True)
class GrantRecord:
    """One period of an operator's access to a tenant: live while ``revoked_at`` is None."""

    operator_id: str
    reconciliation: bool
    granted_at: datetime
    revoked_by: str | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class Job:
    """An export's row, every column in the table's order."""

    id: UUID
    tenant_id: UUID
    status: str
    version: int
    destination_id: UUID
    attempt_id: UUID | None
    attempt_count: int
    claimed_by: str | None
    lease_expires_at: datetime | None
    stop_request_id: UUID | None
    cancellation_request_id: UUID | None
    expected_file_name: str | None
    expected_file_bytes: int | None
    expected_file_sha256: bytes | None
    delivery_authorized_at: datetime | None
    woken_at: datetime
    failure_reason: str | None
    delivery_key: str
    replaces_job_id: UUID | None
    created_by: str
    replacement_reason: str | None
    overwrite_agreement_ref: str | None
    sweep_count: int
    created_at: datetime
    deferrals: int
    deferred_since: datetime | None
    last_deferral: str | None
    #: Recorded at cutoff 2: the delivery profile version the file was built with.
    expected_profile_version: int | None
    #: Recorded at cutoff 2: the completion marker written after the file, and its content.
    expected_marker_name: str | None
    expected_marker: bytes | None
    #: A schedule's export: the schedule and the slot (local wall-clock time in the schedule's zone).
    schedule_id: UUID | None
    schedule_slot: datetime | None
    #: Incremental: the changes since this snapshot (None: since nothing, a full first run).
    incremental: bool
    incremental_since: str | None
    #: Recorded at cutoff 2 for an incremental export: the snapshot its build read, the next run's watermark.
    expected_snapshot: str | None
    #: Recorded at cutoff 2: how the file is published (``app.delivery.modes``).
    expected_delivery_mode: str | None


@dataclass(frozen=True)
class AttemptEvent:
    id: int
    attempt_id: UUID
    kind: str
    version: int | None
    worker_id: str | None
    observed_by: str | None
    detail: str | None
    recorded_at: datetime


@dataclass(frozen=True)
class CancellationRequest:
    id: UUID
    requested_by: str
    reason: str | None
    outcome: str
    found_status: str
    found_attempt_id: UUID | None
    found_attempt_count: int
    found_delivery_authorized_at: datetime | None
    recorded_at: datetime


@dataclass(frozen=True)
class JobWebhook:
    """One outcome of the export told to one of its tenant's webhook endpoints, and how that is going."""
    event_id: UUID
    endpoint_name: str
    status: str
    state: str
    attempts: int
    occurred_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class OutboxEntry:
    message_id: UUID
    kind: str
    created_at: datetime
    published_at: datetime | None
    #: A wake-up due later (a deferral's); None: due when written.
    due_at: datetime | None


@dataclass(frozen=True)
class JobHistory:
    """What happened to one export: its destination's name (None once deleted), attempt events in
    order, cancellation requests, outbox rows and the outcomes told to webhooks in the order they were
    recorded."""

    destination_name: str | None
    events: list[AttemptEvent]
    cancellation_requests: list[CancellationRequest]
    outbox: list[OutboxEntry]
    webhooks: list[JobWebhook]
    #: What holds a Queued export now (its tenant paused, its destination paused or draining), or None.
    held_by: str | None = None


#: The failures that finalized no file, after which an export may be replaced (export_create_replacement).
REPLACEABLE_FAILURES = ("BuildFailed", "AttemptsExhausted", "NotDelivered")


@dataclass(frozen=True)
class EndedWithoutFile:
    """An export that failed without finalizing a file: itself, or the replacement of ``replaces_job_id``."""

    id: UUID
    replaces_job_id: UUID | None
    failure_reason: str
    ended_at: datetime

    @property
    def original_id(self) -> UUID:
        """What a replacement of it replaces: the original, always."""
        return self.replaces_job_id or self.id


@dataclass(frozen=True)
class JobPosition:
    """A job's place in a listing, newest first."""

    created_at: datetime
    id: UUID


@dataclass(frozen=True)
class JobSummary:
    """One line of a listing."""

    id: UUID
    tenant_name: str
    destination_name: str | None
    status: str
    failure_reason: str | None
    version: int
    attempt_count: int
    created_by: str
    created_at: datetime
    #: The schedule that made it; None for an export someone created.
    schedule_id: UUID | None = None


@dataclass(frozen=True)
class Schedule:
    id: UUID
    tenant_id: UUID
    destination_id: UUID
    cron: str
    time_zone: str
    incremental: bool
    state: str
    next_fire_at: datetime | None
    created_by: str
    created_at: datetime
    changed_by: str
    changed_at: datetime


@dataclass(frozen=True)
class ScheduleRun:
    """A decided slot, with its export's status now (None: no export)."""

    slot: datetime
    fire_at: datetime
    trigger: str
    outcome: str
    job_id: UUID | None
    detail: str | None
    decided_at: datetime
    status: str | None
    failure_reason: str | None


#: What a read raises when the database went away under it (restarted, or its session terminated):
#: peewee's wrapping of psycopg's OperationalError, for callers that retry rather than fail.
UNAVAILABLE: tuple[type[Exception], ...] = (peewee.OperationalError, peewee.InterfaceError)


class ReadOnlyDatabase(peewee.PostgresqlDatabase):
    """psycopg 3 under a role, every transaction read-only, so the models cannot write through it."""

    def __init__(self, url: str, role: Role):
        super().__init__(url, prefer_psycopg3=True, autoconnect=True)
        self._url = url
        self._role = role

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                               application_name="exports-read")
        try:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self._role.value)))
            conn.execute("SET default_transaction_read_only = on")
        except BaseException:
            conn.close()
            raise
        return conn


def _select(model: type[peewee.Model], shape: type[Any]) -> peewee.ModelSelect:
    """The model's columns that the dataclass ``shape`` names, in its order."""
    return model.select(*(getattr(model, f.name) for f in dataclasses.fields(shape)))


class Views:
    """The operator's reads on one read-only database under ``role``; it connects on the first read."""

    def __init__(self, url: str, role: Role = Role.APP):
        self._db = ReadOnlyDatabase(url, role)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Views:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _all(self, shape: type[_Row], query: Any) -> list[_Row]:
        """The rows of a peewee query (typed loosely: .dicts() yields mappings, not models)."""
        return [shape(**row) for row in query.dicts().bind(self._db)]

    def _one(self, shape: type[_Row], query: Any) -> _Row | None:
        rows = self._all(shape, query.limit(1))
        return rows[0] if rows else None

    def tenant(self, tenant_id: UUID) -> Tenant | None:
        return self._one(Tenant, _select(models.Tenant, Tenant).where(models.Tenant.id == tenant_id))

    def tenants_named(self, name: str, *, limit: int) -> list[Tenant]:
        return self._all(Tenant, _select(models.Tenant, Tenant).where(models.Tenant.name == name).limit(limit))

    def destination(self, tenant_id: UUID, destination_id: UUID) -> Destination | None:
        """One of this tenant's destinations; another tenant's answers None, like a missing one."""
        D = models.Destination
        return self._one(Destination,
                         _select(D, Destination).where((D.tenant_id == tenant_id) & (D.id == destination_id)))

    def destinations_named(self, tenant_id: UUID, name: str, *, limit: int) -> list[Destination]:
        D = models.Destination
        return self._all(Destination, _select(D, Destination).where((D.tenant_id == tenant_id) & (D.name == name))
                         .limit(limit))

    def job(self, tenant_id: UUID, job_id: UUID) -> Job | None:
        """This tenant's export; another tenant's answers None, like a missing one."""
        J = models.ExportJob
        return self._one(Job, _select(J, Job).where((J.id == job_id) & (J.tenant_id == tenant_id)))

    def grant(self, operator_id: str, tenant_id: UUID) -> Grant | None:
        """The operator's live grant for the tenant; a revoked one answers None, like one never made."""
        A = models.OperatorAccess
        return self._one(Grant, _select(A, Grant).where((A.operator_id == operator_id) & (A.tenant_id == tenant_id)
                                                        & A.revoked_at.is_null()))

    def grants(self, tenant_id: UUID, *, revoked: bool) -> list[GrantRecord]:
        """The tenant's grants by operator, the live ones only unless ``revoked``; a revoked period after
        the live one that followed it."""
        A = models.OperatorAccess
        query = _select(A, GrantRecord).where(A.tenant_id == tenant_id)
        if not revoked:
            query = query.where(A.revoked_at.is_null())
        return self._all(GrantRecord, query.order_by(A.operator_id, A.granted_at, A.id))

    def history(self, job: Job) -> JobHistory:
        E, C, M, D = models.AttemptEvent, models.CancellationRequest, models.OutboxRow, models.Destination
        return JobHistory(
            destination_name=D.select(D.name).where(D.id == job.destination_id).limit(1).bind(self._db).scalar(),
            events=self._all(AttemptEvent, _select(E, AttemptEvent).where(E.job_id == job.id).order_by(E.id)),
            cancellation_requests=self._all(CancellationRequest, _select(C, CancellationRequest)
                                            .where((C.tenant_id == job.tenant_id) & (C.job_id == job.id))
                                            .order_by(C.recorded_at)),
            outbox=self._all(OutboxEntry, _select(M, OutboxEntry).where(M.job_id == job.id).order_by(M.created_at)),
            webhooks=self._webhooks(job),
            held_by=self._held_by(job) if job.status == Status.QUEUED.value else None,
        )

    def _held_by(self, job: Job) -> str | None:
        T, D = models.Tenant, models.Destination
        tenant = T.select(T.paused_by, T.paused_at).where(T.id == job.tenant_id).dicts().bind(self._db).first()
        if tenant and tenant["paused_at"] is not None:
            return f"its tenant, paused by {tenant['paused_by']} at {tenant['paused_at']:%Y-%m-%d %H:%M:%S}"
        dest = (D.select(D.pause_state, D.paused_by, D.paused_at).where(D.id == job.destination_id)
                .dicts().bind(self._db).first())
        if dest and dest["pause_state"] is not None:
            return (f"its destination, {dest['pause_state']} by {dest['paused_by']} at "
                    f"{dest['paused_at']:%Y-%m-%d %H:%M:%S}")
        return None

    def _webhooks(self, job: Job) -> list[JobWebhook]:
        W, E = models.WebhookDelivery, models.WebhookEndpoint
        return self._all(JobWebhook, W.select(W.id.alias("event_id"), E.name.alias("endpoint_name"), W.status,
                                              W.state, W.attempts, W.occurred_at, W.finished_at)
                         .join(E, on=(E.id == W.endpoint_id))
                         .where((W.tenant_id == job.tenant_id) & (W.job_id == job.id))
                         .order_by(W.occurred_at, W.id))

    def jobs(self, *, tenant_id: UUID | None = None, status: Status | None = None, limit: int,
             destination_id: UUID | None = None, since: datetime | None = None, until: datetime | None = None,
             after: JobPosition | None = None, schedule_id: UUID | None = None) -> list[JobSummary]:
        """Exports newest first, of one tenant or all: an index scan of (tenant, created_at), (status,
        created_at), (schedule, created_at) or created_at that stops at ``limit``, however long the history.
        ``since`` (inclusive) and ``until`` (exclusive) bound created_at; ``after`` continues a listing after
        a job it showed (a keyset cursor: rows created meanwhile never shift a page)."""
        J, T, D = models.ExportJob, models.Tenant, models.Destination
        query = (J.select(J.id, T.name.alias("tenant_name"), D.name.alias("destination_name"), J.status,
                          J.failure_reason, J.version, J.attempt_count, J.created_by, J.created_at, J.schedule_id)
                 .join(T, on=(T.id == J.tenant_id))
                 .switch(J)
                 .join(D, peewee.JOIN.LEFT_OUTER, on=(D.id == J.destination_id)))
        if tenant_id is not None:
            query = query.where(J.tenant_id == tenant_id)
        if status is not None:
            query = query.where(J.status == status.value)
        if destination_id is not None:
            query = query.where(J.destination_id == destination_id)
        if schedule_id is not None:
            query = query.where(J.schedule_id == schedule_id)
        if since is not None:
            query = query.where(J.created_at >= since)
        if until is not None:
            query = query.where(J.created_at < until)
        if after is not None:
            query = query.where(peewee.Tuple(J.created_at, J.id) < peewee.Tuple(after.created_at, after.id))
        return self._all(JobSummary, query.order_by(J.created_at.desc(), J.id.desc()).limit(limit))

    def queued_ids(self, tenant_id: UUID, *, destination_id: UUID | None = None) -> list[UUID]:
        """The tenant's Queued exports, to one destination if given, oldest first
        (``ix_export_jobs_tenant_status``)."""
        J = models.ExportJob
        query = J.select(J.id).where((J.tenant_id == tenant_id) & (J.status == Status.QUEUED.value))
        if destination_id is not None:
            query = query.where(J.destination_id == destination_id)
        return [row.id for row in query.order_by(J.created_at, J.id).bind(self._db)]

    def ended_without_file(self, tenant_id: UUID, *, since: datetime,
                           destination_id: UUID | None = None) -> list[EndedWithoutFile]:
        """The tenant's exports that failed without finalizing a file (BuildFailed, AttemptsExhausted,
        NotDelivered: the failures a replacement may follow) and whose last event, their ending or a later
        correction, is at or after ``since``; to one destination, if given; in the order they ended."""
        J, E = models.ExportJob, models.AttemptEvent
        ended = E.select(peewee.fn.MAX(E.recorded_at)).where(E.job_id == J.id)
        query = (J.select(J.id, J.replaces_job_id, J.failure_reason, ended.alias("ended_at"))
                 .where((J.tenant_id == tenant_id) & (J.status == Status.FAILED.value)
                        & J.failure_reason.in_(REPLACEABLE_FAILURES) & (ended >= since))
                 .order_by(ended, J.id))
        if destination_id is not None:
            query = query.where(J.destination_id == destination_id)
        return self._all(EndedWithoutFile, query)

    def job_position(self, job_id: UUID, *, tenant_id: UUID | None) -> JobPosition | None:
        """Where a job stands in a listing (a cursor); of the tenant's jobs only, when one is given."""
        J = models.ExportJob
        query = _select(J, JobPosition).where(J.id == job_id)
        if tenant_id is not None:
            query = query.where(J.tenant_id == tenant_id)
        return self._one(JobPosition, query)

    def counts_by_status(self, *, tenant_id: UUID | None = None) -> dict[str, int]:
        """How many exports are in each status that has any, of one tenant or all."""
        J = models.ExportJob
        query: Any = J.select(J.status, peewee.fn.COUNT(J.id).alias("n"))
        if tenant_id is not None:
            query = query.where(J.tenant_id == tenant_id)
        return {row["status"]: row["n"] for row in query.group_by(J.status).dicts().bind(self._db)}

    def schedule(self, tenant_id: UUID, schedule_id: UUID) -> Schedule | None:
        """This tenant's schedule; another tenant's answers None, like a missing one."""
        S = models.Schedule
        return self._one(Schedule, _select(S, Schedule).where((S.tenant_id == tenant_id) & (S.id == schedule_id)))

    def schedules(self, *, tenant_id: UUID | None = None, limit: int) -> list[Schedule]:
        S = models.Schedule
        query = _select(S, Schedule)
        if tenant_id is not None:
            query = query.where(S.tenant_id == tenant_id)
        return self._all(Schedule, query.order_by(S.created_at.desc(), S.id).limit(limit))

    def schedule_runs(self, schedule_id: UUID, *, limit: int) -> list[ScheduleRun]:
        """A schedule's decided slots, newest first, with what became of each one's export."""
        R, J = models.ScheduleRun, models.ExportJob
        query = (R.select(R.slot, R.fire_at, R.trigger, R.outcome, R.job_id, R.detail, R.decided_at, J.status,
                          J.failure_reason)
                 .join(J, peewee.JOIN.LEFT_OUTER, on=(J.id == R.job_id))
                 .where(R.schedule_id == schedule_id)
                 .order_by(R.slot.desc()).limit(limit))
        return self._all(ScheduleRun, query)
