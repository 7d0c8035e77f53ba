"""The operator's reads (app/store/views.py) against a real PostgreSQL: they run under their role on a
read-only connection, another tenant's rows read like missing ones, and a Job carries every column."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import peewee
import pytest

from app.store import cancellation, models
from app.store.types import Role, Status
from app.store.views import Job, ReadOnlyDatabase, Views


@pytest.fixture
def views(db_url: str) -> Iterator[Views]:
    with Views(db_url, Role.APP) as opened:
        yield opened


def test_the_read_database_runs_under_its_role_and_refuses_every_write(db_url, admin):
    db = ReadOnlyDatabase(db_url, Role.APP)
    try:
        assert db.execute_sql("SELECT current_user").fetchone() == ("exports_app",)
        with pytest.raises(peewee.InternalError, match="read-only transaction"):
            models.Tenant.insert(id=uuid.uuid4(), name="Sneaky").bind(db).execute()
    finally:
        db.close()
    assert admin.execute("SELECT count(*) AS n FROM tenants").fetchone()["n"] == 0


def test_another_tenants_export_destination_and_grant_read_like_missing_ones(views, seed):
    job = seed.queued()
    other = seed.tenant("Globex")

    assert views.job(job.tenant_id, job.id).id == job.id
    assert views.job(other, job.id) is None
    assert views.destination(job.tenant_id, job.destination_id).id == job.destination_id
    assert views.destination(other, job.destination_id) is None
    assert views.destinations_named(other, "partner", limit=2) == []
    assert views.grant("tests", other) is None


def test_a_name_shared_by_two_tenants_reads_as_both(views, seed):
    first, second = seed.tenant("Initech"), seed.tenant("Initech")

    assert {t.id for t in views.tenants_named("Initech", limit=2)} == {first, second}
    assert views.tenant(first).name == "Initech"
    assert views.tenant(uuid.uuid4()) is None


def test_a_job_reads_every_column_of_export_jobs_in_order(views, seed, admin):
    job = seed.queued()

    row = admin.execute("SELECT * FROM export_jobs WHERE id = %s", (job.id,)).fetchone()
    assert dataclasses.asdict(views.job(job.tenant_id, job.id)) == row
    assert list(row) == [f.name for f in dataclasses.fields(Job)]


def test_history_lists_events_requests_and_outbox_of_that_export_only(views, seed, conn):
    job = seed.finished(Status.COMPLETED, seed.queued())
    bystander = seed.queued(job.tenant_id, job.destination_id)
    cancellation.request_cancellation(conn, tenant_id=job.tenant_id, job_id=job.id, request_id=uuid.uuid4(),
                                      requested_by="alice", reason=None, lock_timeout="1s")

    history = views.history(views.job(job.tenant_id, job.id))

    assert history.destination_name == "partner"
    assert [e.kind for e in history.events] == ["Claimed", "DeliveryAuthorized", "Finished"]
    assert [r.outcome for r in history.cancellation_requests] == ["TooLate"]
    assert [o.message_id for o in history.outbox] == [r["message_id"] for r in seed.outbox(job)]
    assert views.history(views.job(job.tenant_id, bystander.id)).events == []


def test_listing_and_counts_are_of_one_tenant_when_asked(views, seed):
    mine = seed.queued()
    seed.running(seed.queued(mine.tenant_id, mine.destination_id))
    theirs = seed.queued()

    assert views.counts_by_status(tenant_id=mine.tenant_id) == {"Queued": 1, "Running": 1}
    assert views.counts_by_status() == {"Queued": 2, "Running": 1}
    listed = views.jobs(tenant_id=mine.tenant_id, status=Status.QUEUED, limit=10)
    assert [j.id for j in listed] == [mine.id]
    assert {j.id for j in views.jobs(limit=10)} >= {mine.id, theirs.id}
