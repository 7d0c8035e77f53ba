"""Outbox retention: old published rows are archived and then deleted; an unpublished row, a young row and
the history tables are never touched; nobody but the retention role may delete."""

from __future__ import annotations

import gzip
import json

import psycopg
import pytest

from app.store import relay, retention
from app.store.types import Role


def _age(admin, message_ids, days: float) -> None:
    """Moves rows into the past: time travel no role may make, so with the owner's triggers off."""
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("UPDATE outbox SET created_at = created_at - make_interval(days => %s),"
                      " published_at = published_at - make_interval(days => %s) WHERE message_id = ANY(%s)",
                      (days, days, message_ids))


def test_old_published_rows_are_archived_then_deleted_and_nothing_else_is(seed, admin, connect_as, db_url, tmp_path):
    old_published, young_published, old_unpublished = seed.queued(), seed.queued(), seed.queued()
    dispatcher = connect_as(Role.DISPATCHER)
    ids = {job: seed.outbox(job)[0]["message_id"] for job in (old_published, young_published, old_unpublished)}
    assert relay.mark_published(dispatcher, message_ids=[ids[old_published], ids[young_published]]) == 2
    _age(admin, [ids[old_published], ids[old_unpublished]], 40)
    events_before = admin.execute("SELECT count(*) AS n FROM export_attempt_events").fetchone()["n"]

    archived = retention.archive_published(db_url, older_than_seconds=30 * 86400, archive_dir=tmp_path / "archive")

    assert archived.rows == 1 and len(archived.files) == 1
    [line] = gzip.open(archived.files[0], "rt").read().splitlines()
    assert json.loads(line)["message_id"] == str(ids[old_published])
    remaining = {r["message_id"] for r in admin.execute("SELECT message_id FROM outbox")}
    assert remaining == {ids[young_published], ids[old_unpublished]}
    assert admin.execute("SELECT count(*) AS n FROM export_attempt_events").fetchone()["n"] == events_before


def test_nothing_old_enough_writes_no_archive(seed, db_url, tmp_path):
    seed.queued()

    assert retention.archive_published(db_url, older_than_seconds=86400, archive_dir=tmp_path) == \
        retention.Archived(0, ())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("role", [Role.APP, Role.DISPATCHER])
def test_the_app_and_the_relay_still_may_not_delete_from_the_outbox(seed, connect_as, role):
    job = seed.queued()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        connect_as(role).execute("DELETE FROM outbox WHERE job_id = %s", (job.id,))


def test_even_the_retention_role_may_not_delete_an_unpublished_row(seed, connect_as):
    job = seed.queued()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only retention deletes a published row"):
        connect_as(Role.RETENTION).execute("DELETE FROM outbox WHERE job_id = %s", (job.id,))
