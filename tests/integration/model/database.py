"""What the database holds, read as the owner, and how it differs from the reference model.

Two kinds of check: ``differences`` compares every job, its history, its wake-ups, its webhook
deliveries and its cancellation requests with the model; ``Transitions`` checks, from the database
alone, that each status change since the last look is proved by the event the protocol requires and
that nothing but a correction moved a terminal job.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from uuid import UUID

import psycopg
from psycopg import sql

from tests.integration.model.reference import PROOF, TERMINAL, Model

_TABLES = """
SELECT quote_ident(relname) AS name FROM pg_class
WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relname <> 'schema_version'
"""


def empty(admin: psycopg.Connection) -> None:
    """Deletes every row, so each example starts from the migrated schema alone: the append-only
    triggers are skipped for this one transaction (replica mode), exactly as the fixtures recycle a
    database between tests."""
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        for row in admin.execute(_TABLES).fetchall():
            admin.execute(sql.SQL("DELETE FROM {}").format(sql.SQL(row["name"])))


@dataclass(frozen=True)
class Snapshot:
    rows: dict[UUID, dict]
    events: dict[UUID, list[tuple[str, UUID]]]
    wakeups: Counter
    message_ids_keyed_on_jobs: int
    requests: dict[tuple[UUID, UUID], dict]
    #: Each job's webhook deliveries, in the order their outcomes committed: (status, failure code).
    told: dict[UUID, list[tuple[str, str | None]]]


def snapshot(admin: psycopg.Connection) -> Snapshot:
    rows = {r["id"]: r for r in admin.execute(
        "SELECT *, lease_expires_at > clock_timestamp() AS lease_current FROM export_jobs")}
    events: dict[UUID, list[tuple[str, UUID]]] = defaultdict(list)
    for e in admin.execute("SELECT job_id, kind, attempt_id FROM export_attempt_events ORDER BY id"):
        events[e["job_id"]].append((e["kind"], e["attempt_id"]))
    wakeups = Counter({r["job_id"]: r["n"] for r in admin.execute(
        "SELECT job_id, count(*) AS n FROM outbox GROUP BY job_id")})
    keyed = admin.execute("SELECT count(*) AS n FROM outbox WHERE message_id = job_id").fetchone()["n"]
    requests = {(r["tenant_id"], r["id"]): r for r in admin.execute("SELECT * FROM cancellation_requests")}
    told: dict[UUID, list[tuple[str, str | None]]] = defaultdict(list)
    for d in admin.execute("SELECT job_id, status, failure_reason FROM webhook_deliveries ORDER BY occurred_at, id"):
        told[d["job_id"]].append((d["status"], d["failure_reason"]))
    return Snapshot(rows, dict(events), wakeups, keyed, requests, dict(told))


def _lease(row: dict) -> str | None:
    if row["lease_expires_at"] is None:
        return None
    return "current" if row["lease_current"] else "expired"


def differences(now: Snapshot, model: Model) -> list[str]:
    """Every way the database differs from the model; empty when they agree."""
    found: list[str] = []
    if set(now.rows) != set(model.jobs):
        found.append(f"jobs: database {sorted(map(str, now.rows))}, model {sorted(map(str, model.jobs))}")
    for job_id, job in model.jobs.items():
        row = now.rows.get(job_id)
        if row is None:
            continue
        name = f"job {str(job_id)[-8:]}"
        expected = dict(
            status=job.status, failure_reason=job.failure, version=job.version, destination_id=job.destination,
            attempt_id=job.attempt, attempt_count=job.attempt_count, stop_request_id=job.stop_request,
            cancellation_request_id=job.canceled_by, sweep_count=job.sweeps, replaces_job_id=job.original,
            delivery_key=job.key, tenant_id=job.tenant)
        for column, value in expected.items():
            if row[column] != value:
                found.append(f"{name}: {column} is {row[column]!r}, the model says {value!r}")
        if _lease(row) != job.lease:
            found.append(f"{name}: lease is {_lease(row)!r}, the model says {job.lease!r}")
        history = now.events.get(job_id, [])
        if history != job.history:
            found.append(f"{name}: events {_kinds(history)}, the model says {_kinds(job.history)}")
        if now.wakeups[job_id] != job.wakeups:
            found.append(f"{name}: {now.wakeups[job_id]} outbox rows, the model says {job.wakeups}")
        if now.told.get(job_id, []) != job.told:
            found.append(f"{name}: webhook deliveries {now.told.get(job_id, [])}, the model says {job.told}")
    if now.message_ids_keyed_on_jobs:
        found.append(f"{now.message_ids_keyed_on_jobs} outbox rows reuse the job id as their message id")
    if set(now.requests) != set(model.requests):
        found.append(f"cancellation requests: database {len(now.requests)}, model {len(model.requests)}")
    for key, request in model.requests.items():
        row = now.requests.get(key)
        if row is None:
            continue
        recorded = (row["job_id"], row["requested_by"], row["outcome"], row["found_status"],
                    row["found_attempt_id"], row["found_attempt_count"])
        expected_request = (request.job, request.requested_by, request.outcome, request.found_status,
                            request.found_attempt, request.found_attempt_count)
        if recorded != expected_request:
            found.append(f"request {str(key[1])[-8:]}: recorded {recorded}, the model says {expected_request}")
    return found


def _kinds(history: list[tuple[str, UUID]]) -> list[str]:
    return [f"{kind}@{str(attempt)[-4:]}" for kind, attempt in history]


#: Two writers at once can make two transitions between two looks (a requeue, then a cancel).
MAX_TRANSITIONS_PER_STEP = 2


def _explained(before: str, after: str, events: list[str], steps: int) -> bool:
    """Whether the events lead from ``before`` to ``after`` along transitions of the protocol, each
    recording one of its proving events (or none, where none proves it)."""
    if before == after and not events:
        return True
    if steps == 0:
        return False
    for (source, target), proof in PROOF.items():
        if source != before or (source in TERMINAL and proof != {"Corrected"}):
            continue
        if not proof and _explained(target, after, events, steps - 1):
            return True
        if proof and events and events[0] in proof and _explained(target, after, events[1:], steps - 1):
            return True
    return False


@dataclass
class Transitions:
    """The database's own account, step to step, independent of the model."""

    statuses: dict[UUID, str] = field(default_factory=dict)
    seen_events: dict[UUID, int] = field(default_factory=dict)

    def violations(self, now: Snapshot) -> list[str]:
        found: list[str] = []
        for job_id, row in now.rows.items():
            name = f"job {str(job_id)[-8:]}"
            status = row["status"]
            if (status == "Failed") != (row["failure_reason"] is not None):
                found.append(f"{name}: {status} with failure_reason {row['failure_reason']!r}")
            history = now.events.get(job_id, [])
            claims = [attempt for kind, attempt in history if kind == "Claimed"]
            if len(claims) != row["attempt_count"] or len(set(claims)) != len(claims):
                found.append(f"{name}: attempt_count {row['attempt_count']} with claims {len(claims)}")
            new = [kind for kind, _ in history[self.seen_events.get(job_id, 0):] if kind != "DeliveryEvidence"]
            before = self.statuses.get(job_id)
            if before is None:
                if status != "Queued" or new:
                    found.append(f"{name}: created as {status} with events {new}")
            elif not _explained(before, status, new, steps=MAX_TRANSITIONS_PER_STEP):
                found.append(f"{name}: {before} -> {status} with events {new} is no path of the protocol"
                             " (each change proved by its event, a terminal state left only by a correction)")
            self.statuses[job_id] = status
            self.seen_events[job_id] = len(history)
        return found
