"""The chaos soak's reads, as the database owner: the whole history its invariant checker judges, one
job's history for its report, and the liveness reads it polls while faults are injected. Test
equipment (``exports_devtools.chaos``) only; nothing here writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg

from exports_devtools.store import queries

Row = dict[str, Any]


@dataclass(frozen=True)
class History:
    """Every row the checker judges, read in one snapshot: jobs in creation order (each with its
    destination's ``remote_dir``); events, outbox rows, cancellation requests and webhook deliveries by
    job, each job's in the order they were written; every destination's directory; and the tenants with a
    webhook endpoint."""

    jobs: list[Row]
    events: dict[UUID, list[Row]]
    outbox: dict[UUID, list[Row]]
    cancellations: dict[UUID, list[Row]]
    remote_dirs: list[str]
    webhooks: dict[UUID, list[Row]]
    notified_tenants: frozenset[UUID]


def _by_job(rows: list[Row]) -> dict[UUID, list[Row]]:
    grouped: dict[UUID, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row["job_id"], []).append(row)
    return grouped


def read_history(conn: psycopg.Connection[Any]) -> History:
    """Every job, event, outbox row and cancellation request. ``conn`` is in autocommit mode, so the
    reads share one repeatable-read transaction of their own."""
    with conn.transaction():
        queries.execute(conn, "chaos_snapshot")
        jobs = queries.fetch_all(conn, "chaos_jobs", dict(job_id=None))
        events = queries.fetch_all(conn, "chaos_events")
        outbox = queries.fetch_all(conn, "chaos_outbox")
        cancellations = queries.fetch_all(conn, "chaos_cancellations")
        remote_dirs = [r["remote_dir"] for r in queries.fetch_all(conn, "chaos_remote_dirs")]
        webhooks = queries.fetch_all(conn, "chaos_webhook_deliveries")
        notified = frozenset(r["tenant_id"] for r in queries.fetch_all(conn, "chaos_notified_tenants"))
    return History(jobs, _by_job(events), _by_job(outbox), _by_job(cancellations), remote_dirs, _by_job(webhooks),
                   notified)


@dataclass(frozen=True)
class Slots:
    """Every schedule, every slot decided, and every export a schedule made, read in one snapshot."""

    schedules: list[Row]
    runs: list[Row]
    jobs: list[Row]


def read_slots(conn: psycopg.Connection[Any]) -> Slots:
    with conn.transaction():
        queries.execute(conn, "chaos_snapshot")
        return Slots(queries.fetch_all(conn, "chaos_schedules"), queries.fetch_all(conn, "chaos_schedule_runs"),
                     queries.fetch_all(conn, "chaos_scheduled_jobs"))


def job_rows(conn: psycopg.Connection[Any], job_id: UUID) -> tuple[Row | None, list[Row], list[Row], list[Row]]:
    """One job's row (None if missing; with its destination's ``remote_dir``), events, outbox rows and
    cancellation requests, in one snapshot."""
    params = dict(job_id=job_id)
    with conn.transaction():
        queries.execute(conn, "chaos_snapshot")
        row = queries.fetch_one(conn, "chaos_jobs", params)
        events = queries.fetch_all(conn, "chaos_job_events", params)
        outbox = queries.fetch_all(conn, "chaos_job_outbox", params)
        cancellations = queries.fetch_all(conn, "chaos_job_cancellations", params)
    return row, events, outbox, cancellations


def overdue_leases(conn: psycopg.Connection[Any], *, grace_seconds: float) -> list[Row]:
    """Running and Delivering jobs whose lease expired more than ``grace_seconds`` ago, oldest first:
    ``id, status, attempt_id, claimed_by, lease_expires_at, overdue_seconds``."""
    return queries.fetch_all(conn, "chaos_overdue_leases", dict(grace_seconds=grace_seconds))


def stale_queued(conn: psycopg.Connection[Any], *, older_than_seconds: float) -> list[Row]:
    """Queued jobs whose newest wake-up (``last_wake_up``: the newest outbox row's
    ``coalesce(due_at, created_at)``, or ``woken_at`` when retention archived them all) is older than
    ``older_than_seconds``, oldest first: ``id, woken_at, sweep_count, deferrals, last_wake_up, age_seconds``."""
    return queries.fetch_all(conn, "chaos_stale_queued", dict(older_than_seconds=older_than_seconds))


def counts_by_status(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Jobs by status; a status no job has is absent."""
    return {r["status"]: r["n"] for r in queries.fetch_all(conn, "chaos_counts_by_status")}


def status_of(conn: psycopg.Connection[Any], job_ids: Iterable[UUID]) -> dict[UUID, str]:
    """The status of each found job; a missing job is absent from the answer."""
    rows = queries.fetch_all(conn, "chaos_status_of", dict(job_ids=list(job_ids)))
    return {r["id"]: r["status"] for r in rows}


def unpublished_outbox(conn: psycopg.Connection[Any], *, due_only: bool = False) -> int:
    """Outbox rows not published yet; with ``due_only``, only those already due."""
    row = queries.fetch_one(conn, "chaos_unpublished_outbox", dict(due_only=due_only))
    return row["n"] if row else 0


def pending_webhooks(conn: psycopg.Connection[Any]) -> int:
    """Webhook deliveries still owed to a receiver."""
    row = queries.fetch_one(conn, "chaos_pending_webhooks")
    return row["n"] if row else 0


def final_states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Jobs by status, a Failed one by its code as well (``"Failed/NotDelivered"``); absent: none."""
    return {r["state"]: r["n"] for r in queries.fetch_all(conn, "chaos_final_states")}
