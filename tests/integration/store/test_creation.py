"""Creation: the job, its deliveries row and its first wake-up are written by one statement, together
or not at all, and only an original mints a delivery key, even against a direct INSERT."""

from __future__ import annotations

import uuid

import pytest
from psycopg import errors as pg

from app.store import export
from app.store.export import CreateResult
from app.store.types import Status
from tests.factories import Job
from tests.factories_more import insert_job_directly


def _create(seed, tenant_id, destination_id, delivery_key: str | None = None) -> tuple[Job, CreateResult]:
    job = Job(uuid.uuid4(), tenant_id, destination_id, delivery_key or uuid.uuid4().hex)
    result = export.create(seed.conn, job_id=job.id, tenant_id=tenant_id, destination_id=destination_id,
                         delivery_key=job.delivery_key, created_by="ops-alice")
    return job, result


def _deliveries(admin, tenant_id, delivery_key) -> list[dict]:
    return admin.execute("SELECT * FROM deliveries WHERE tenant_id = %s AND delivery_key = %s",
                         (tenant_id, delivery_key)).fetchall()


def _job_exists(admin, job_id) -> bool:
    return admin.execute("SELECT 1 FROM export_jobs WHERE id = %s", (job_id,)).fetchone() is not None


def test_creation_writes_a_queued_job_its_delivery_row_and_one_unpublished_wakeup(seed, admin):
    tenant = seed.tenant()
    job, result = _create(seed, tenant, seed.destination(tenant))

    assert result is CreateResult.CREATED
    row = seed.row(job)
    assert (row["status"], row["version"], row["attempt_count"], row["replaces_job_id"]) == ("Queued", 1, 0, None)
    assert row["created_by"] == "ops-alice" and row["woken_at"] is not None
    assert [(d["original_job_id"]) for d in _deliveries(admin, tenant, job.delivery_key)] == [job.id]
    [wakeup] = seed.outbox(job)
    assert (wakeup["kind"], wakeup["published_at"]) == ("ExportReady", None)


def test_a_creation_whose_job_insert_fails_leaves_no_delivery_row_and_no_wakeup(seed, admin):
    first = seed.queued()
    other_key = uuid.uuid4().hex

    # Reusing a job id makes the job's INSERT fail after the deliveries INSERT of the same statement ran.
    with pytest.raises(pg.UniqueViolation) as refused:
        export.create(seed.conn, job_id=first.id, tenant_id=first.tenant_id, destination_id=first.destination_id,
                    delivery_key=other_key, created_by="ops-alice")

    assert refused.value.diag.constraint_name == "export_jobs_pkey"
    assert _deliveries(admin, first.tenant_id, other_key) == []
    assert len(seed.outbox(first)) == 1
    assert seed.row(first)["delivery_key"] == first.delivery_key


def test_a_creation_whose_wakeup_insert_fails_leaves_no_job_and_no_delivery_row(seed, admin):
    tenant = seed.tenant()
    destination = seed.destination(tenant)
    # Fault injection by the owner: the outbox INSERT, the statement's last part, fails.
    admin.execute("""
        CREATE FUNCTION test_refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'outbox unavailable' USING ERRCODE = 'P0001'; END $$;
        CREATE TRIGGER test_refuse_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION test_refuse_outbox();
    """)
    job = Job(uuid.uuid4(), tenant, destination, uuid.uuid4().hex)

    with pytest.raises(pg.RaiseException, match="outbox unavailable"):
        export.create(seed.conn, job_id=job.id, tenant_id=tenant, destination_id=destination,
                    delivery_key=job.delivery_key, created_by="ops-alice")

    assert not _job_exists(admin, job.id)
    assert _deliveries(admin, tenant, job.delivery_key) == []


def test_a_second_original_with_the_same_key_in_the_same_tenant_is_refused_as_key_taken(seed, admin):
    first = seed.queued()
    before = seed.row(first)

    second, result = _create(seed, first.tenant_id, first.destination_id, first.delivery_key)

    assert result is CreateResult.KEY_TAKEN
    assert not _job_exists(admin, second.id)
    assert admin.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (second.id,)).fetchone()["n"] == 0
    assert [d["original_job_id"] for d in _deliveries(admin, first.tenant_id, first.delivery_key)] == [first.id]
    assert seed.row(first) == before


def test_a_second_original_inserted_directly_with_a_taken_key_is_refused_by_uq_export_jobs_original_key(seed, admin):
    first = seed.queued()

    # The key's deliveries row exists, so the foreign key is satisfied: only the partial index stands.
    with pytest.raises(pg.UniqueViolation) as refused:
        insert_job_directly(admin, first)

    assert refused.value.diag.constraint_name == "uq_export_jobs_original_key"
    assert admin.execute(
        "SELECT count(*) AS n FROM export_jobs WHERE tenant_id = %s AND delivery_key = %s",
        (first.tenant_id, first.delivery_key)).fetchone()["n"] == 1


def test_a_second_delivery_row_inserted_directly_for_a_taken_key_is_refused_by_pk_deliveries(seed, admin):
    first = seed.queued()

    with pytest.raises(pg.UniqueViolation) as refused:
        admin.execute("INSERT INTO deliveries (tenant_id, delivery_key, original_job_id, file_name)"
                      " VALUES (%s, %s, %s, 'other.csv')", (first.tenant_id, first.delivery_key, uuid.uuid4()))

    assert refused.value.diag.constraint_name == "pk_deliveries"
    assert [d["original_job_id"] for d in _deliveries(admin, first.tenant_id, first.delivery_key)] == [first.id]


def test_the_same_key_in_another_tenant_is_a_different_delivery(seed, admin):
    first = seed.queued()
    other_tenant = seed.tenant("Globex")

    second, result = _create(seed, other_tenant, seed.destination(other_tenant), first.delivery_key)

    assert result is CreateResult.CREATED
    assert seed.status(second) is Status.QUEUED and seed.status(first) is Status.QUEUED
    assert [d["original_job_id"] for d in _deliveries(admin, other_tenant, first.delivery_key)] == [second.id]
    assert [d["original_job_id"] for d in _deliveries(admin, first.tenant_id, first.delivery_key)] == [first.id]


def test_a_destination_of_another_tenant_is_refused_as_unknown_and_nothing_is_written(seed, admin):
    tenant = seed.tenant()
    other_tenant = seed.tenant("Globex")
    foreign_destination = seed.destination(other_tenant)

    job, result = _create(seed, tenant, foreign_destination)

    assert result is CreateResult.UNKNOWN_DESTINATION
    assert not _job_exists(admin, job.id)
    assert _deliveries(admin, tenant, job.delivery_key) == []
    assert admin.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (job.id,)).fetchone()["n"] == 0
