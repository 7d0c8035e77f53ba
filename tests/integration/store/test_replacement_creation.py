"""Replacement creation: the statement inserts nothing unless the original may be replaced, the
foreign key to deliveries ties a replacement to its original's tenant and key, and
uq_export_jobs_one_replacement allows one live or delivered replacement per original."""

from __future__ import annotations

import uuid

import pytest
from psycopg import errors as pg

from app.store import export
from app.store.types import FailureCode, ReplacementResult, Role, Status
from tests.factories import Job
from tests.factories_more import WORKER, States, insert_job_directly
from tests.support import Background, wait_until_blocked


@pytest.fixture
def states(seed) -> States:
    return States(seed)


def _try_replace(conn, original: Job, tenant_id=None, *, job_id=None) -> tuple[uuid.UUID, ReplacementResult]:
    job_id = job_id or uuid.uuid4()
    result = export.create_replacement(conn, job_id=job_id, tenant_id=tenant_id or original.tenant_id,
                                     original_job_id=original.id, created_by="ops-alice",
                                     replacement_reason="original unresolved after reconciliation")
    return job_id, result


def _written(admin, job_id) -> tuple[bool, int]:
    """Whether a job row exists for ``job_id``, and how many wake-ups it has."""
    job = admin.execute("SELECT 1 FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
    wakeups = admin.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (job_id,)).fetchone()["n"]
    return job is not None, wakeups


def _replacements_of(admin, original: Job) -> list[dict]:
    return admin.execute("SELECT id, status FROM export_jobs WHERE replaces_job_id = %s ORDER BY id",
                         (original.id,)).fetchall()


NOT_REPLACEABLE = [
    pytest.param(Status.COMPLETED, None, id="Completed"),
    pytest.param(Status.RUNNING, None, id="Running"),
    pytest.param(Status.DELIVERING, None, id="Delivering"),
    pytest.param(Status.QUEUED, None, id="Queued"),
    pytest.param(Status.FAILED, FailureCode.FINAL_NAME_OCCUPIED, id="Failed-FinalNameOccupied"),
    pytest.param(Status.FAILED, FailureCode.ORIGINAL_DELIVERED, id="Failed-OriginalDelivered"),
    pytest.param(Status.STOPPED, None, id="Stopped"),
    pytest.param(Status.CANCELED, None, id="Canceled"),
    pytest.param(Status.REJECTED, None, id="Rejected"),
]


@pytest.mark.parametrize(("status", "code"), NOT_REPLACEABLE)
def test_replacement_creation_inserts_nothing_for_an_original_that_may_not_be_replaced(states, seed, admin,
                                                                                      status, code):
    original = states.in_state(status, code)
    before = seed.row(original)

    job_id, result = _try_replace(seed.conn, original)

    assert result is ReplacementResult.NOT_ALLOWED
    assert _written(admin, job_id) == (False, 0)
    assert seed.row(original) == before


REPLACEABLE = [
    pytest.param("outcome_unknown_by_worker", id="OutcomeUnknown-by-worker"),
    pytest.param("outcome_unknown_by_recovery", id="OutcomeUnknown-by-recovery"),
    pytest.param(FailureCode.BUILD_FAILED, id="Failed-BuildFailed"),
    pytest.param(FailureCode.ATTEMPTS_EXHAUSTED, id="Failed-AttemptsExhausted"),
    pytest.param(FailureCode.NOT_DELIVERED, id="Failed-NotDelivered"),
]


def _replaceable(states: States, how) -> Job:
    return states.failed(how) if isinstance(how, FailureCode) else getattr(states, how)()


@pytest.mark.parametrize("how", REPLACEABLE)
def test_replacement_creation_queues_a_replacement_carrying_the_originals_key(states, seed, admin, how):
    original = _replaceable(states, how)
    before = seed.row(original)

    job_id = uuid.uuid4()
    result = export.create_replacement(seed.conn, job_id=job_id, tenant_id=original.tenant_id,
                                     original_job_id=original.id, created_by="ops-alice",
                                     replacement_reason="partner confirmed nothing arrived",
                                     overwrite_agreement_ref="contract-7 section 4")

    assert result is ReplacementResult.CREATED
    row = admin.execute("SELECT * FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
    assert (row["status"], row["version"], row["attempt_count"]) == ("Queued", 1, 0)
    assert (row["tenant_id"], row["destination_id"], row["delivery_key"], row["replaces_job_id"]) == (
        original.tenant_id, original.destination_id, original.delivery_key, original.id)
    assert (row["created_by"], row["replacement_reason"], row["overwrite_agreement_ref"]) == (
        "ops-alice", "partner confirmed nothing arrived", "contract-7 section 4")
    assert _written(admin, job_id) == (True, 1)
    # Only an original mints a key: the replacement adds no deliveries row.
    assert admin.execute("SELECT original_job_id FROM deliveries WHERE tenant_id = %s AND delivery_key = %s",
                         (original.tenant_id, original.delivery_key)).fetchall() == [{"original_job_id": original.id}]
    assert seed.row(original) == before


def test_replacement_creation_inserts_nothing_for_another_tenants_original(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    other_tenant = seed.tenant("Globex")

    job_id, result = _try_replace(seed.conn, original, tenant_id=other_tenant)

    assert result is ReplacementResult.NOT_ALLOWED
    assert _written(admin, job_id) == (False, 0)
    assert _replacements_of(admin, original) == []


def test_replacement_creation_inserts_nothing_when_it_names_a_replacement_as_the_original(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    first = states.replacement(original)
    # The replacement is itself OutcomeUnknown, so only "is an original" stands in the way.
    states.outcome_unknown_by_worker(seed.running(first))

    job_id, result = _try_replace(seed.conn, first)

    assert result is ReplacementResult.NOT_ALLOWED
    assert _written(admin, job_id) == (False, 0)


# --- the database, bypassing the statement ----------------------------------------------------------


def test_the_database_refuses_a_replacement_whose_key_differs_from_its_originals(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    # Another original of the same tenant owns the other key, so only the link to the original is wrong.
    other = seed.queued(original.tenant_id, original.destination_id)

    with pytest.raises(pg.ForeignKeyViolation) as refused:
        insert_job_directly(admin, other, replaces_job_id=original.id, replacement_reason="direct")

    assert refused.value.diag.constraint_name == "fk_export_jobs_replaces"
    assert _replacements_of(admin, original) == []


def test_the_database_refuses_a_replacement_whose_tenant_differs_from_its_originals(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    # The other tenant owns the same key too, so only the link to the original is wrong.
    other_tenant = seed.tenant("Globex")
    other_destination = seed.destination(other_tenant)
    assert export.create(seed.conn, job_id=uuid.uuid4(), tenant_id=other_tenant, destination_id=other_destination,
                       delivery_key=original.delivery_key, created_by="tests") is export.CreateResult.CREATED
    replacement = Job(uuid.uuid4(), other_tenant, other_destination, original.delivery_key)

    with pytest.raises(pg.ForeignKeyViolation) as refused:
        insert_job_directly(admin, replacement, id=replacement.id, replaces_job_id=original.id,
                            replacement_reason="direct")

    assert refused.value.diag.constraint_name == "fk_export_jobs_replaces"
    assert _replacements_of(admin, original) == []


def test_the_database_refuses_a_replacement_that_names_another_replacement(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    first = states.replacement(original)

    with pytest.raises(pg.ForeignKeyViolation) as refused:
        insert_job_directly(admin, first, replaces_job_id=first.id, replacement_reason="direct")

    assert refused.value.diag.constraint_name == "fk_export_jobs_replaces"
    assert admin.execute("SELECT count(*) AS n FROM export_jobs WHERE replaces_job_id = %s",
                         (first.id,)).fetchone()["n"] == 0


# --- one replacement at a time ----------------------------------------------------------------------


def test_of_two_simultaneous_creations_the_second_waits_then_fails_on_the_one_replacement_index(
        states, seed, admin, connect_as):
    original = states.outcome_unknown_by_worker()
    first_conn, second_conn = connect_as(Role.APP), connect_as(Role.APP)

    with first_conn.transaction():
        first_id, first_result = _try_replace(first_conn, original)
        assert first_result is ReplacementResult.CREATED
        second = Background(lambda: _try_replace(second_conn, original))
        wait_until_blocked(admin, second_conn, by=first_conn)
    second_id, second_result = second.result()

    assert second_result is ReplacementResult.SLOT_TAKEN
    assert _written(admin, second_id) == (False, 0)
    assert _replacements_of(admin, original) == [{"id": first_id, "status": "Queued"}]


def test_a_queued_replacement_keeps_the_slot(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    first = states.replacement(original)

    job_id, result = _try_replace(seed.conn, original)

    assert result is ReplacementResult.SLOT_TAKEN
    assert _written(admin, job_id) == (False, 0)
    assert seed.status(first) is Status.QUEUED


def test_a_completed_replacement_keeps_the_slot_for_good(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    first = seed.running(states.replacement(original))
    seed.delivering(first, replaces_job_id=original.id)
    assert export.try_finish_delivery(seed.conn, job_id=first.id, attempt_id=first.attempt_id, worker_id=WORKER,
                                    outcome=Status.COMPLETED) == 1

    job_id, result = _try_replace(seed.conn, original)

    assert result is ReplacementResult.SLOT_TAKEN
    assert _written(admin, job_id) == (False, 0)


def test_a_replacement_that_found_the_originals_file_keeps_the_slot_for_good(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    first = seed.running(states.replacement(original))
    assert export.try_finish_failed(seed.conn, job_id=first.id, attempt_id=first.attempt_id, worker_id=WORKER,
                                  failure_reason=FailureCode.ORIGINAL_DELIVERED) == 1

    job_id, result = _try_replace(seed.conn, original)

    assert result is ReplacementResult.SLOT_TAKEN
    assert _written(admin, job_id) == (False, 0)


def test_a_replacement_that_ended_failed_not_delivered_frees_the_slot(states, seed, admin):
    original = states.outcome_unknown_by_worker()
    first = seed.running(states.replacement(original))
    seed.delivering(first, replaces_job_id=original.id)
    assert export.try_finish_delivery(seed.conn, job_id=first.id, attempt_id=first.attempt_id, worker_id=WORKER,
                                    outcome=Status.FAILED, failure_reason=FailureCode.NOT_DELIVERED) == 1

    job_id, result = _try_replace(seed.conn, original)

    assert result is ReplacementResult.CREATED
    assert _written(admin, job_id) == (True, 1)
    assert {r["id"] for r in _replacements_of(admin, original)} == {first.id, job_id}


def test_a_creation_racing_a_correction_to_completed_waits_for_it_then_inserts_nothing(
        states, seed, admin, connect_as):
    original = states.failed(FailureCode.NOT_DELIVERED)
    reconciler, creator = connect_as(Role.RECONCILER), connect_as(Role.APP)

    with reconciler.transaction():
        assert export.correct(reconciler, tenant_id=original.tenant_id, job_id=original.id,
                                attempt_id=original.attempt_id, recorded_status=Status.FAILED,
                                corrected_status=Status.COMPLETED, failure_reason=None,
                                evidence_ref="partner listing 2026-11-29", why="the file arrived after all",
                                corrected_by="ops-carol")
        creation = Background(lambda: _try_replace(creator, original))
        wait_until_blocked(admin, creator, by=reconciler)
    job_id, result = creation.result()

    assert result is ReplacementResult.NOT_ALLOWED
    assert _written(admin, job_id) == (False, 0)
    assert seed.status(original) is Status.COMPLETED
