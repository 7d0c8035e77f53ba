"""Every statement that gives an export an outcome tells the tenant's webhooks in the same statement: one
delivery per live endpoint of the job's tenant, with the outcome the row now holds and who recorded it;
none for a tenant without an endpoint, none from a write that matched nothing, and none from an
outcome that rolled back."""

from __future__ import annotations

import uuid
from uuid import UUID

import psycopg
import pytest

from app.store import cancellation, export, recovery, webhooks
from app.store.types import FailureCode, Role, Status
from tests.factories import Job, Seeder


def add_endpoint(conn: psycopg.Connection, tenant_id: UUID, name: str = "prod") -> UUID:
    endpoint_id = uuid.uuid4()
    added = webhooks.add_endpoint(conn, endpoint_id=endpoint_id, endpoint=webhooks.NewEndpoint(
        tenant_id=tenant_id, name=name, url=f"https://hooks.example/{name}", secret_ref="env:ACME_HOOK_SECRET",
        created_by="tests"))
    assert added is webhooks.AddResult.ADDED
    return endpoint_id


def deliveries(admin: psycopg.Connection, job: Job) -> list[dict]:
    return admin.execute("SELECT * FROM webhook_deliveries WHERE job_id = %s ORDER BY occurred_at, id",
                         (job.id,)).fetchall()


def told(admin: psycopg.Connection, job: Job) -> list[tuple]:
    """What each delivery of the job says: (endpoint, status, failure reason, source, attempt)."""
    return [(d["endpoint_id"], d["status"], d["failure_reason"], d["source"], d["attempt_id"])
            for d in deliveries(admin, job)]


@pytest.fixture
def tenant(seed: Seeder) -> UUID:
    return seed.tenant("Acme")


@pytest.fixture
def endpoint(conn, tenant) -> UUID:
    return add_endpoint(conn, tenant)


def _stop_requested(seed: Seeder, conn, tenant: UUID) -> Job:
    job = seed.running(seed.queued(tenant))
    cancellation.request_cancellation(conn, tenant_id=tenant, job_id=job.id, request_id=uuid.uuid4(),
                                      requested_by="dana")
    return job


# --- the worker's terminal writes ----------------------------------------------------------------


def test_a_stopped_attempt_tells_the_endpoint_stopped_by_the_worker(seed, conn, admin, tenant, endpoint):
    job = _stop_requested(seed, conn, tenant)

    assert export.try_finish_stopped(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                     stop_point="WhileBuilding") == 1

    assert told(admin, job) == [(endpoint, "Stopped", None, "worker", job.attempt_id)]


def test_a_failed_build_tells_the_endpoint_failed_with_its_code(seed, conn, admin, tenant, endpoint):
    job = seed.running(seed.queued(tenant))

    assert export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                    failure_reason=FailureCode.BUILD_FAILED) == 1

    assert told(admin, job) == [(endpoint, "Failed", "BuildFailed", "worker", job.attempt_id)]


@pytest.mark.parametrize("outcome, code", [(Status.COMPLETED, None), (Status.OUTCOME_UNKNOWN, None),
                                           (Status.FAILED, FailureCode.NOT_DELIVERED)])
def test_a_delivery_s_terminal_write_tells_the_endpoint_its_outcome(seed, conn, admin, tenant, endpoint, outcome, code):
    job = seed.delivering(seed.queued(tenant))

    assert export.try_finish_delivery(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                      outcome=outcome, failure_reason=code) == 1

    assert told(admin, job) == [(endpoint, outcome.value, code.value if code else None, "worker", job.attempt_id)]


def test_a_rejection_tells_the_endpoint_rejected_by_policy(seed, conn, admin, tenant, endpoint):
    job = seed.queued(tenant)

    assert export.reject(conn, job_id=job.id, checked_version=1) is True

    assert told(admin, job) == [(endpoint, "Rejected", None, "policy", None)]


# --- the operator's ------------------------------------------------------------------------------


def test_a_cancel_of_a_queued_job_tells_the_endpoint_canceled(seed, conn, admin, tenant, endpoint):
    job = seed.queued(tenant)

    result = cancellation.request_cancellation(conn, tenant_id=tenant, job_id=job.id, request_id=uuid.uuid4(),
                                               requested_by="dana")

    assert result.outcome is not None and result.outcome.value == "CanceledWhileQueued"
    assert told(admin, job) == [(endpoint, "Canceled", None, "cancellation", None)]


def test_a_stop_request_is_no_outcome_and_tells_nothing_until_the_attempt_stops(seed, conn, admin, tenant, endpoint):
    job = _stop_requested(seed, conn, tenant)

    assert told(admin, job) == []


@pytest.mark.parametrize("resolution, code", [(Status.COMPLETED, None), (Status.FAILED, "NotDelivered")])
def test_a_reconciliation_tells_the_endpoint_after_its_outcome_unknown(seed, conn, admin, tenant, endpoint,
                                                                        resolution, code):
    job = seed.finished(Status.OUTCOME_UNKNOWN, seed.queued(tenant))

    assert export.reconcile(conn, tenant_id=tenant, job_id=job.id, attempt_id=job.attempt_id, resolution=resolution,
                            evidence="the partner's listing", reconciled_by="rita") is True

    assert told(admin, job) == [(endpoint, "OutcomeUnknown", None, "worker", job.attempt_id),
                                (endpoint, resolution.value, code, "reconciliation", job.attempt_id)]


def test_a_correction_by_the_reconciler_tells_the_endpoint_the_corrected_outcome(seed, connect_as, admin, tenant,
                                                                                 endpoint):
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))

    assert export.correct(connect_as(Role.RECONCILER), tenant_id=tenant, job_id=job.id, attempt_id=job.attempt_id,
                          recorded_status=Status.COMPLETED, corrected_status=Status.FAILED,
                          failure_reason=FailureCode.NOT_DELIVERED, evidence_ref="ticket-7",
                          why="the partner lost it", corrected_by="rita") is True

    assert told(admin, job) == [(endpoint, "Completed", None, "worker", job.attempt_id),
                                (endpoint, "Failed", "NotDelivered", "correction", job.attempt_id)]


# --- recovery's takeovers ------------------------------------------------------------------------


def test_recovery_stopping_an_expired_attempt_tells_the_endpoint_stopped(seed, conn, admin, tenant, endpoint):
    job = _stop_requested(seed, conn, tenant)
    seed.expire_lease(job)

    assert recovery.stop_expired(conn, [(job.id, job.attempt_id)], recovery_run_id="r-1") == [job.id]

    assert told(admin, job) == [(endpoint, "Stopped", None, "recovery", job.attempt_id)]


def test_recovery_exhausting_an_expired_attempt_tells_the_endpoint_failed(seed, conn, admin, tenant, endpoint):
    job = seed.running(seed.queued(tenant))
    seed.expire_lease(job)

    assert recovery.exhaust_expired(conn, [(job.id, job.attempt_id)], max_attempts=1,
                                    recovery_run_id="r-1") == [job.id]

    assert told(admin, job) == [(endpoint, "Failed", "AttemptsExhausted", "recovery", job.attempt_id)]


def test_recovery_requeueing_an_expired_attempt_is_no_outcome(seed, conn, admin, tenant, endpoint):
    job = seed.running(seed.queued(tenant))
    seed.expire_lease(job)

    assert recovery.requeue_expired(conn, [(job.id, job.attempt_id)], max_attempts=5,
                                    recovery_run_id="r-1") == [job.id]

    assert told(admin, job) == []


@pytest.mark.parametrize("resolution", [Status.COMPLETED, Status.OUTCOME_UNKNOWN])
def test_recovery_resolving_an_expired_delivery_tells_the_endpoint(seed, conn, admin, tenant, endpoint, resolution):
    job = seed.delivering(seed.queued(tenant))
    seed.expire_lease(job)

    assert recovery.resolve_delivering(conn, job_id=job.id, expired_attempt_id=job.attempt_id,
                                       resolution=resolution, evidence_summary="listed", recovery_run_id="r-1")

    assert told(admin, job) == [(endpoint, resolution.value, None, "recovery", job.attempt_id)]


# --- who is told, and when nobody is -------------------------------------------------------------


def test_each_live_endpoint_of_the_tenant_gets_its_own_delivery_with_its_own_id(seed, conn, admin, tenant):
    first, second = add_endpoint(conn, tenant, "prod"), add_endpoint(conn, tenant, "audit")
    removed = add_endpoint(conn, tenant, "old")
    assert webhooks.remove_endpoint(conn, tenant_id=tenant, endpoint_id=removed, removed_by="tests")
    job = seed.running(seed.queued(tenant))

    export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                             failure_reason=FailureCode.BUILD_FAILED)

    rows = deliveries(admin, job)
    assert sorted(r["endpoint_id"] for r in rows) == sorted([first, second])
    assert len({r["id"] for r in rows}) == 2
    assert all(r["state"] == "pending" and r["attempts"] == 0 and r["tenant_id"] == tenant for r in rows)


def test_a_tenant_without_an_endpoint_is_told_nothing_while_another_tenant_is(seed, conn, admin, tenant, endpoint):
    quiet = seed.tenant("Globex")
    theirs, ours = seed.running(seed.queued(quiet)), seed.running(seed.queued(tenant))

    for job in (theirs, ours):
        export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                 failure_reason=FailureCode.BUILD_FAILED)

    assert told(admin, theirs) == []
    assert [d["tenant_id"] for d in deliveries(admin, ours)] == [tenant]


def test_a_terminal_write_that_matches_nothing_tells_nothing(seed, conn, admin, tenant, endpoint):
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))

    again = export.try_finish_delivery(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                       outcome=Status.COMPLETED)
    stale = export.try_finish_failed(conn, job_id=job.id, attempt_id=uuid.uuid4(), worker_id="w",
                                     failure_reason=FailureCode.BUILD_FAILED)

    assert (again, stale) == (0, 0)
    assert [d["status"] for d in deliveries(admin, job)] == ["Completed"]


def test_a_second_reconciliation_refused_by_the_unique_index_leaves_no_delivery(seed, conn, admin, tenant, endpoint):
    job = seed.finished(Status.OUTCOME_UNKNOWN, seed.queued(tenant))
    assert export.reconcile(conn, tenant_id=tenant, job_id=job.id, attempt_id=job.attempt_id,
                            resolution=Status.COMPLETED, evidence="listed", reconciled_by="rita")
    admin.execute("UPDATE export_jobs SET status = 'OutcomeUnknown' WHERE id = %s", (job.id,))   # as if never

    refused = export.reconcile(conn, tenant_id=tenant, job_id=job.id, attempt_id=job.attempt_id,
                               resolution=Status.COMPLETED, evidence="listed again", reconciled_by="rita")

    assert refused is False
    assert [d["status"] for d in deliveries(admin, job)] == ["OutcomeUnknown", "Completed"]


def test_an_outcome_rolled_back_with_its_transaction_leaves_no_delivery(seed, connect_as, admin, tenant, endpoint):
    job = seed.delivering(seed.queued(tenant))
    conn = connect_as(Role.APP)

    with pytest.raises(RuntimeError), conn.transaction():
        assert export.try_finish_delivery(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                          outcome=Status.COMPLETED) == 1
        assert len(conn.execute("SELECT id FROM webhook_deliveries WHERE job_id = %s", (job.id,)).fetchall()) == 1
        raise RuntimeError("the transaction ends here, uncommitted")

    assert told(admin, job) == []
    assert Seeder(conn, admin).status(job) is Status.DELIVERING


def test_an_outcome_the_database_refuses_leaves_no_delivery(seed, conn, admin, tenant, endpoint):
    # The application's role may not correct a recorded outcome: the guard refuses the statement, and the
    # delivery its CTE inserted goes with it.
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        export.correct(conn, tenant_id=tenant, job_id=job.id, attempt_id=job.attempt_id,
                       recorded_status=Status.COMPLETED, corrected_status=Status.FAILED,
                       failure_reason=FailureCode.NOT_DELIVERED, evidence_ref="t", why="w", corrected_by="dana")

    assert [d["status"] for d in deliveries(admin, job)] == ["Completed"]


def test_a_delivery_s_event_never_changes_and_no_delivery_is_deleted_even_by_the_owner(seed, conn, admin, tenant,
                                                                                       endpoint):
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))

    for statement in ("UPDATE webhook_deliveries SET status = 'Failed', failure_reason = 'NotDelivered'",
                      "UPDATE webhook_deliveries SET occurred_at = occurred_at - interval '1 day'",
                      "DELETE FROM webhook_deliveries", "TRUNCATE webhook_deliveries CASCADE"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute(statement)

    assert told(admin, job) == [(endpoint, "Completed", None, "worker", job.attempt_id)]
