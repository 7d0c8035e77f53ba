"""Lost responses at the store level: the connection drops around a boundary write (through
tests/fixtures/pgproxy.py), and the wrapper settles the outcome from the row, never from the exception."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from app.store import export, recovery
from app.store.database import Database
from app.store.types import AuthorizationResult, ClaimResult, Role, Status, WriteResult

# Text that only the marked statement carries, so the proxy cuts that statement and no other.
CLAIM = "export_claim"
AUTHORIZE = "export_authorize_delivery"
FINISH_DELIVERY = "export_finish_delivery"


@pytest.fixture
def worker_db(pg_proxy) -> Iterator[Database]:
    """The worker's pool, reaching the database only through the proxy."""
    with Database(pg_proxy.url, Role.APP, max_size=2, name="worker") as db:
        yield db


@pytest.fixture
def fast_reread(monkeypatch) -> None:
    # A re-read that cannot connect gives up after this long; the default is 5 s.
    monkeypatch.setattr(export, "REREAD_TIMEOUT_SECONDS", 1)


def claim(db: Database, job, attempt_id: uuid.UUID) -> ClaimResult:
    return export.claim(db, job_id=job.id, checked_version=1, attempt_id=attempt_id, worker_id="w1", lease_seconds=60)


def resolve_to_outcome_unknown(seed, conn, job):
    """Recovery's takeover of an expired Delivering attempt, committed while the worker waits."""
    def run() -> None:
        seed.expire_lease(job)
        assert recovery.resolve_delivering(conn, job_id=job.id, expired_attempt_id=job.attempt_id,
                                           resolution=Status.OUTCOME_UNKNOWN, evidence_summary="none",
                                           recovery_run_id="recovery-1")
    return run


def test_a_claim_whose_reply_is_lost_after_it_committed_is_confirmed_by_the_reread(pg_proxy, worker_db, seed):
    job = seed.queued()
    attempt_id = uuid.uuid4()
    cut = pg_proxy.cut_after_reply(CLAIM)

    assert claim(worker_db, job, attempt_id) is ClaimResult.CLAIMED

    cut.wait()
    row = seed.row(job)
    assert row["status"] == "Running" and row["attempt_id"] == attempt_id and row["attempt_count"] == 1
    assert seed.event_kinds(job) == ["Claimed"]


def test_an_authorization_whose_reply_is_lost_after_it_committed_is_confirmed_by_the_reread(
        pg_proxy, worker_db, seed):
    job = seed.running()
    cut = pg_proxy.cut_after_reply(AUTHORIZE)

    result = export.authorize_delivery(worker_db, job_id=job.id, tenant_id=job.tenant_id, attempt_id=job.attempt_id,
                                     expected=seed.expected(job), replaces_job_id=None)

    cut.wait()
    assert result is AuthorizationResult.AUTHORIZED
    row = seed.row(job)
    assert row["status"] == "Delivering" and row["attempt_id"] == job.attempt_id
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized"]


def test_a_claim_cut_before_it_reached_the_database_with_a_failed_reread_is_unknown_and_runs_once_later(
        pg_proxy, worker_db, app_db, seed, fast_reread):
    job = seed.queued()
    cut = pg_proxy.cut_before(CLAIM, then_refuse=True)

    assert claim(worker_db, job, uuid.uuid4()) is ClaimResult.UNKNOWN

    cut.wait()
    assert pg_proxy.connections_refused > 0   # the re-read really tried, and failed
    row = seed.row(job)
    assert row["status"] == "Queued" and row["attempt_id"] is None and row["attempt_count"] == 0
    assert seed.events(job) == []

    # The unsettled message is delivered again; this time the claim runs the job, once.
    later_attempt = uuid.uuid4()
    assert claim(app_db, job, later_attempt) is ClaimResult.CLAIMED
    [event] = seed.events(job)
    assert event["kind"] == "Claimed" and event["attempt_id"] == later_attempt
    assert seed.row(job)["attempt_count"] == 1


def test_a_claim_that_committed_with_a_failed_reread_is_unknown_and_the_job_stays_running_for_recovery(
        pg_proxy, worker_db, app_db, conn, seed, fast_reread):
    job = seed.queued()
    attempt_id = uuid.uuid4()
    cut = pg_proxy.cut_after_reply(CLAIM, then_refuse=True)

    assert claim(worker_db, job, attempt_id) is ClaimResult.UNKNOWN

    cut.wait()
    row = seed.row(job)
    assert row["status"] == "Running" and row["attempt_id"] == attempt_id

    # The redelivered message finds the job Running and does nothing.
    assert claim(app_db, job, uuid.uuid4()) is ClaimResult.LOST
    assert seed.row(job)["attempt_id"] == attempt_id

    # Recovery takes the attempt over once its lease expires.
    seed.expire_lease(job)
    assert recovery.requeue_expired(conn, [(job.id, attempt_id)], max_attempts=3,
                                    recovery_run_id="recovery-1")
    assert seed.event_kinds(job) == ["Claimed", "RequeuedByRecovery"]


def test_an_authorization_lost_while_recovery_resolved_the_attempt_reports_not_owner(
        pg_proxy, worker_db, conn, seed):
    job = seed.running()
    cut = pg_proxy.cut_after_reply(AUTHORIZE, on_cut=resolve_to_outcome_unknown(seed, conn, job))

    result = export.authorize_delivery(worker_db, job_id=job.id, tenant_id=job.tenant_id, attempt_id=job.attempt_id,
                                     expected=seed.expected(job), replaces_job_id=None)

    cut.wait()
    # Its own attempt id, in a state other than Delivering: the worker does nothing further.
    assert result is AuthorizationResult.NOT_OWNER
    row = seed.row(job)
    assert row["status"] == "OutcomeUnknown" and row["attempt_id"] == job.attempt_id
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized", "ResolvedByRecovery"]


def test_a_terminal_write_lost_while_recovery_resolved_the_attempt_matches_nothing(pg_proxy, worker_db, conn, seed):
    job = seed.delivering()
    cut = pg_proxy.cut_before(FINISH_DELIVERY, on_cut=resolve_to_outcome_unknown(seed, conn, job))

    result = export.finish_delivery(worker_db, job_id=job.id, attempt_id=job.attempt_id, worker_id="w1",
                                  outcome=Status.COMPLETED)

    cut.wait()
    assert result is WriteResult.NOT_MATCHED
    assert seed.status(job) is Status.OUTCOME_UNKNOWN
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized", "ResolvedByRecovery"]


def test_a_terminal_write_whose_reply_is_lost_after_it_committed_is_confirmed_once(pg_proxy, worker_db, seed):
    job = seed.delivering()
    cut = pg_proxy.cut_after_reply(FINISH_DELIVERY)

    result = export.finish_delivery(worker_db, job_id=job.id, attempt_id=job.attempt_id, worker_id="w1",
                                  outcome=Status.COMPLETED)

    cut.wait()
    assert result is WriteResult.WRITTEN
    assert seed.status(job) is Status.COMPLETED
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized", "Finished"]
