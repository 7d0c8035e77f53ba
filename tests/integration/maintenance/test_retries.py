"""The retry policy: a delivery proven not to have happened for a transient reason is replaced
automatically, with backoff, at most the destination's auto_retries times per delivery key; nothing
else is ever retried."""

from __future__ import annotations

import pytest

from app.maintenance.retries import CREATED_BY, Retries, RetryConfig, RetryCounts
from app.store import export
from app.store.types import FailureCause, FailureCode, Status
from tests.factories import Job
from tests.factories_more import States

WORKER = "worker-test"
#: Small enough that a failure recorded a moment ago is due.
DUE = RetryConfig(backoff_seconds=0.001)


def _not_delivered(seed, job=None, cause=FailureCause.TRANSIENT, detail="upload failed and a fresh listing "
                   "matches the baseline: EOFError"):
    job = seed.delivering(job)
    assert export.try_finish_delivery(seed.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                      outcome=Status.FAILED, failure_reason=FailureCode.NOT_DELIVERED,
                                      cause=cause, detail=detail) == 1
    return job


def _as_job(original: Job, row: dict) -> Job:
    return Job(row["id"], original.tenant_id, original.destination_id, original.delivery_key)


def _jobs_of(admin, job) -> list[dict]:
    return admin.execute("SELECT * FROM export_jobs WHERE tenant_id = %s AND delivery_key = %s ORDER BY created_at",
                         (job.tenant_id, job.delivery_key)).fetchall()


def test_a_transient_non_delivery_is_replaced_by_the_retry_policy_with_the_same_key_and_a_reason(seed, app_db, admin):
    original = _not_delivered(seed)

    counts = Retries(app_db, DUE).run_once()

    assert counts == RetryCounts(due=1, created=1)
    jobs = _jobs_of(admin, original)
    assert len(jobs) == 2
    retry = jobs[1]
    assert (retry["status"], retry["replaces_job_id"], retry["created_by"], retry["delivery_key"]) == (
        "Queued", original.id, CREATED_BY, original.delivery_key)
    assert str(original.attempt_id) in retry["replacement_reason"] and "EOFError" in retry["replacement_reason"]
    assert retry["replacement_reason"].startswith("automatic retry 1 of 3")
    assert len(admin.execute("SELECT * FROM outbox WHERE job_id = %s", (retry["id"],)).fetchall()) == 1
    assert Retries(app_db, DUE).run_once() == RetryCounts()   # the retry is live: nothing more is due


def test_retries_stop_at_the_destinations_limit_per_delivery_key(seed, app_db, admin):
    original = _not_delivered(seed)
    admin.execute("UPDATE destinations SET auto_retries = 2 WHERE id = %s", (original.destination_id,))
    for _ in range(2):
        assert Retries(app_db, DUE).run_once().created == 1
        newest = _jobs_of(admin, original)[-1]
        _not_delivered(seed, seed.running(_as_job(original, newest)))

    assert Retries(app_db, DUE).run_once() == RetryCounts()
    jobs = _jobs_of(admin, original)
    assert [j["created_by"] for j in jobs] == ["tests", CREATED_BY, CREATED_BY]
    assert {j["replaces_job_id"] for j in jobs[1:]} == {original.id}


def test_a_destination_with_automatic_retries_off_gets_none(seed, app_db, admin):
    original = _not_delivered(seed)
    admin.execute("UPDATE destinations SET auto_retries = 0 WHERE id = %s", (original.destination_id,))

    assert Retries(app_db, DUE).run_once() == RetryCounts()
    assert len(_jobs_of(admin, original)) == 1


def test_a_retry_waits_for_its_backoff(seed, app_db, admin):
    original = _not_delivered(seed)

    assert Retries(app_db, RetryConfig(backoff_seconds=3600)).run_once() == RetryCounts()
    assert len(_jobs_of(admin, original)) == 1


@pytest.mark.parametrize("case", ["permanent", "configuration before cutoff 2", "deferral budget spent",
                                  "reconciled", "completed", "outcome unknown original"])
def test_nothing_but_a_transient_non_delivery_after_cutoff_2_is_retried(seed, app_db, admin, case):
    states = States(seed)
    if case == "permanent":
        job = _not_delivered(seed, cause=FailureCause.PERMANENT, detail="rename refused: Failure")
    elif case in ("configuration before cutoff 2", "deferral budget spent"):
        job = seed.running()
        cause = FailureCause.CONFIGURATION if case.startswith("configuration") else FailureCause.TRANSIENT
        assert export.try_finish_failed(seed.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                        failure_reason=FailureCode.NOT_DELIVERED, cause=cause, detail="x") == 1
    elif case == "reconciled":
        job = states.outcome_unknown_by_worker()
        assert export.reconcile(seed.conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=job.attempt_id,
                                resolution=Status.FAILED, evidence="partner: nothing arrived", reconciled_by="rita")
    elif case == "completed":
        job = seed.finished(Status.COMPLETED)
    else:
        # An operator replaced an OutcomeUnknown original; the replacement failed transiently.
        original = states.outcome_unknown_by_worker()
        replacement = states.replacement(original)
        job = _not_delivered(seed, seed.running(replacement))
    before = _jobs_of(admin, job)

    assert Retries(app_db, DUE).run_once() == RetryCounts()
    assert _jobs_of(admin, job) == before


def test_an_incremental_export_is_never_retried_automatically(seed, app_db, admin):
    original = _not_delivered(seed)
    admin.execute("UPDATE export_jobs SET incremental = true WHERE id = %s", (original.id,))   # as a schedule makes it

    assert Retries(app_db, DUE).run_once() == RetryCounts()
    assert len(_jobs_of(admin, original)) == 1
