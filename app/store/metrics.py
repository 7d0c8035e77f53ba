"""The scheduler's gauges, read from the database on each scrape (``sql/metrics.sql``)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from app.store import connector


@dataclass(frozen=True)
class Backlog:
    #: Outbox rows due and not yet published; their oldest's age counts from when it fell due.
    unpublished: int
    oldest_unpublished_seconds: float
    #: Outbox rows written for later (deferrals' wake-ups), not yet due.
    scheduled: int
    #: Queued jobs waiting out a deferral's backoff.
    deferred_jobs: int
    oldest_queued_seconds: float
    expired_leases: int
    #: How long the longest-expired lease has waited for recovery (0 when none): a dead scheduler shows here.
    oldest_expired_lease_seconds: float
    outcome_unknown: int
    #: The highest sweep_count of a Queued job: how often the sweeper republished the most neglected one.
    max_sweeps: int
    #: Destinations whose circuit is open: their exports defer without building until a probe connects.
    open_circuits: int
    #: Queued jobs of a paused tenant or a paused or draining destination: they wait for a resume.
    held_jobs: int = 0


def jobs_by_status(conn: psycopg.Connection) -> dict[str, int]:
    return {r["status"]: r["jobs"] for r in connector.fetch_all(conn, "metrics_jobs_by_status")}


def failed_by_code(conn: psycopg.Connection) -> dict[str, int]:
    return {r["code"]: r["jobs"] for r in connector.fetch_all(conn, "metrics_failed_by_code")}


def backlog(conn: psycopg.Connection) -> Backlog:
    row = connector.fetch_one(conn, "metrics_backlog")
    assert row is not None   # one row of scalar subqueries, always
    return Backlog(unpublished=row["unpublished"],
                   oldest_unpublished_seconds=float(row["oldest_unpublished_seconds"] or 0),
                   scheduled=row["scheduled"], deferred_jobs=row["deferred_jobs"],
                   oldest_queued_seconds=float(row["oldest_queued_seconds"] or 0),
                   expired_leases=row["expired_leases"],
                   oldest_expired_lease_seconds=float(row["oldest_expired_lease_seconds"] or 0),
                   outcome_unknown=row["outcome_unknown"],
                   max_sweeps=row["max_sweeps"], open_circuits=row["open_circuits"], held_jobs=row["held_jobs"])


@dataclass(frozen=True)
class Schedules:
    active: int
    #: How long the most overdue active schedule's fire has waited for a scheduler (0 when none is due).
    overdue_seconds: float
    #: Slots of incremental schedules waiting for an earlier run to settle.
    held_slots: int


def schedules(conn: psycopg.Connection) -> Schedules:
    row = connector.fetch_one(conn, "metrics_schedules")
    assert row is not None   # one row of scalar subqueries, always
    return Schedules(active=row["active"], overdue_seconds=float(row["overdue_seconds"]), held_slots=row["held_slots"])


def live_processes(conn: psycopg.Connection, *, silent_seconds: float) -> dict[str, int]:
    return {r["role"]: r["processes"]
            for r in connector.fetch_all(conn, "metrics_live_processes", dict(silent_seconds=silent_seconds))}


@dataclass(frozen=True)
class WebhookBacklog:
    #: Events owed to receivers; the oldest one's age since its outcome (0 when none).
    pending: int
    oldest_pending_seconds: float
    #: Endpoints owed an event for longer than the threshold asked for.
    late_endpoints: int
    #: Deliveries given up past the horizon, in all and in the last day.
    dead: int
    dead_last_day: int


@dataclass(frozen=True)
class LateWebhook:
    tenant: str
    webhook: str
    seconds: float


def webhooks(conn: psycopg.Connection, *, late_seconds: float) -> WebhookBacklog:
    row = connector.fetch_one(conn, "metrics_webhooks", dict(late_seconds=late_seconds))
    assert row is not None   # one row of scalar subqueries, always
    return WebhookBacklog(pending=row["pending"], oldest_pending_seconds=float(row["oldest_pending_seconds"] or 0),
                          late_endpoints=row["late_endpoints"], dead=row["dead"], dead_last_day=row["dead_last_day"])


def late_webhooks(conn: psycopg.Connection, *, late_seconds: float, limit: int) -> list[LateWebhook]:
    return [LateWebhook(r["tenant"], r["webhook"], float(r["seconds"])) for r in connector.fetch_all(
        conn, "metrics_late_webhooks", dict(late_seconds=late_seconds, limit=limit))]
