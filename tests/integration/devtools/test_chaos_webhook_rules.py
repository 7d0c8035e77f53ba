"""The chaos checker's webhook rules: the outcomes of a notified tenant's jobs, given through the real
statements and delivered, break no rule; a delivery missing, extra, left pending or never taken by the
receiver (forged by the owner, triggers off for that transaction alone) is named by its rule on its job."""

from __future__ import annotations

import uuid
from uuid import UUID

import psycopg
import pytest

from app.store import export, webhooks
from app.store.types import FailureCode, Role, Status
from exports_devtools.chaos import webhooks as rules
from exports_devtools.store import chaos
from tests.factories import Job, Seeder
from tests.factories_more import States


def _endpoint(conn: psycopg.Connection, tenant: UUID) -> None:
    webhooks.add_endpoint(conn, endpoint_id=uuid.uuid4(), endpoint=webhooks.NewEndpoint(
        tenant_id=tenant, name="hooks", url="https://hooks.example/", secret_ref="env:HOOK", created_by="t"))


def _forge(admin: psycopg.Connection, statement: str, params: tuple = ()) -> None:
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute(statement, params)


def _broken(admin: psycopg.Connection, received: set[str] | None) -> dict[UUID, dict[str, str]]:
    history = chaos.read_history(admin)
    found = {}
    for job in history.jobs:
        problems = rules.problems(job, history.events.get(job["id"], []), history.webhooks.get(job["id"], []),
                                  job["tenant_id"] in history.notified_tenants, received)
        if problems:
            found[job["id"]] = problems
    return found


@pytest.fixture
def scene(seed: Seeder, conn, connect_as, admin) -> dict[str, Job]:
    """A notified tenant's jobs in every outcome, one reconciled and one corrected after it, and a quiet
    tenant's job; every delivery taken by the receiver."""
    tenant = seed.tenant("Notified")
    _endpoint(conn, tenant)
    states = States(seed)
    jobs = {
        "completed": seed.finished(Status.COMPLETED, seed.queued(tenant)),
        "reconciled": seed.finished(Status.OUTCOME_UNKNOWN, seed.queued(tenant)),
        "corrected": seed.finished(Status.COMPLETED, seed.queued(tenant)),
        "failed": states.failed(FailureCode.BUILD_FAILED, seed.queued(tenant)),
        "exhausted": states.failed(FailureCode.ATTEMPTS_EXHAUSTED, seed.queued(tenant)),
        "rejected": seed.queued(tenant),
        "quiet": seed.finished(Status.COMPLETED),
    }
    assert export.reject(conn, job_id=jobs["rejected"].id, checked_version=1)
    j = jobs["reconciled"]
    assert export.reconcile(conn, tenant_id=tenant, job_id=j.id, attempt_id=j.attempt_id,
                            resolution=Status.COMPLETED, evidence="listed", reconciled_by="rita")
    j = jobs["corrected"]
    assert export.correct(connect_as(Role.RECONCILER), tenant_id=tenant, job_id=j.id, attempt_id=j.attempt_id,
                          recorded_status=Status.COMPLETED, corrected_status=Status.FAILED,
                          failure_reason=FailureCode.NOT_DELIVERED, evidence_ref="t-1", why="lost", corrected_by="r")
    admin.execute("UPDATE webhook_deliveries SET state = 'delivered', finished_at = clock_timestamp()")
    return jobs


def _received(admin: psycopg.Connection) -> set[str]:
    return {str(r["id"]) for r in admin.execute("SELECT id FROM webhook_deliveries")}


def test_every_outcome_told_in_order_and_taken_breaks_no_rule(scene, admin):
    history = chaos.read_history(admin)

    assert _broken(admin, _received(admin)) == {}
    assert [d["status"] for d in history.webhooks[scene["reconciled"].id]] == ["OutcomeUnknown", "Completed"]
    assert [d["status"] for d in history.webhooks[scene["corrected"].id]] == ["Completed", "Failed"]
    assert scene["quiet"].id not in history.webhooks


def test_an_outcome_that_told_nothing_is_a_webhook_mismatch(scene, admin):
    job = scene["reconciled"]
    _forge(admin, "DELETE FROM webhook_attempts")
    _forge(admin, "DELETE FROM webhook_deliveries WHERE job_id = %s AND status = 'Completed'", (job.id,))

    assert _broken(admin, _received(admin)) == {
        job.id: {"webhook-mismatch": "outcomes ['OutcomeUnknown', 'Completed'] but webhook deliveries "
                                     "['OutcomeUnknown']"}}


def test_a_delivery_for_a_tenant_without_an_endpoint_is_a_webhook_mismatch(scene, admin):
    job = scene["quiet"]
    endpoint = admin.execute("SELECT endpoint_id, tenant_id FROM webhook_deliveries LIMIT 1").fetchone()
    _forge(admin, "INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, status, source, state, finished_at)"
                  " VALUES (%s, %s, %s, 'Completed', 'worker', 'delivered', clock_timestamp())",
           (endpoint["endpoint_id"], endpoint["tenant_id"], job.id))

    broken = _broken(admin, _received(admin))

    assert list(broken) == [job.id] and "has no webhook endpoint" in broken[job.id]["webhook-mismatch"]


def test_a_delivery_still_pending_or_never_taken_by_the_receiver_is_undelivered(scene, admin):
    pending, untaken = scene["failed"], scene["rejected"]
    admin.execute("UPDATE webhook_deliveries SET state = 'pending', finished_at = NULL WHERE job_id = %s",
                  (pending.id,))
    untaken_id = str(admin.execute("SELECT id FROM webhook_deliveries WHERE job_id = %s",
                                   (untaken.id,)).fetchone()["id"])

    broken = _broken(admin, _received(admin) - {untaken_id})

    assert set(broken) == {pending.id, untaken.id}
    assert "(Failed) pending after 0 attempt(s)" in broken[pending.id]["webhook-undelivered"]
    assert "(Rejected) delivered but never taken by the receiver" in broken[untaken.id]["webhook-undelivered"]
