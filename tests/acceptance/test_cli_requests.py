"""``exports create`` and ``exports replace`` with request ids, run as the real console script: a
submission repeated with its id answers the export already created, a reused id is refused, and a busy
answer writes nothing and names the id to retry with."""

from __future__ import annotations

import uuid

import pytest

from app.cli.common import EXIT_BUSY, EXIT_REFUSED
from app.store import connector
from tests.acceptance.test_cli import Tenant, grant, one_line_error, snapshot


@pytest.fixture
def tenant(seed, conn) -> Tenant:
    """Tenant 'Initech' with one destination, 'partner', and operator 'alice' granted for it."""
    tenant_id = seed.tenant("Initech")
    destination_id = seed.destination(tenant_id)
    grant(conn, tenant_id, "alice")
    return Tenant(tenant_id, destination_id)


CREATE = ("create", "--tenant", "Initech", "--destination", "partner", "--by", "alice")


def exports_of(admin) -> list[dict]:
    return admin.execute("SELECT * FROM export_jobs ORDER BY created_at").fetchall()


def test_create_prints_the_request_id_it_minted_and_a_retry_with_it_is_a_replay_that_queues_nothing(
        exports_cli, admin, tenant):
    first = exports_cli(*CREATE, "--json").json
    request_id = first["request_id"]
    assert uuid.UUID(request_id) and first["replay"] is False

    again = exports_cli(*CREATE, "--request-id", request_id)

    assert first["job_id"] in again.stdout and "a replay" in again.stdout and "nothing new queued" in again.stdout
    assert [str(j["id"]) for j in exports_of(admin)] == [first["job_id"]]
    assert admin.execute("SELECT count(*) AS n FROM outbox").fetchone()["n"] == 1


def test_create_with_a_request_id_used_for_another_destination_is_refused_and_changes_nothing(
        exports_cli, admin, seed, tenant):
    admin.execute("WITH d AS (INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir,"
                  " host_key, credential_ref) VALUES (%s, %s, 'archive', 'h', 22, 'u', '/', 'h ssh-ed25519 AAAA',"
                  " 'env:X') RETURNING id) INSERT INTO delivery_profiles (destination_id, version, profile, created_by)"
                  " SELECT id, 1, '{}', 'tests' FROM d", (uuid.uuid4(), tenant.id))
    request_id = exports_cli(*CREATE, "--json").json["request_id"]
    before = snapshot(admin)

    result = exports_cli("create", "--tenant", "Initech", "--destination", "archive", "--by", "alice",
                         "--request-id", request_id, expect=EXIT_REFUSED)

    one_line_error(result)
    assert "RequestIdReused" in result.stderr
    assert snapshot(admin) == before


def test_create_while_its_request_id_is_locked_answers_busy_writes_nothing_and_the_retry_succeeds(
        exports_cli, admin, tenant, connect_as):
    request_id = uuid.uuid4()
    holder = connect_as(autocommit=False)
    holder.execute(connector.text("creation_record_request"), dict(
        tenant_id=tenant.id, request_id=request_id, kind="Create", job_id=uuid.uuid4(), requested_by="alice",
        destination_id=tenant.destination_id, original_job_id=None, overwrite_agreement_ref=None))
    args = (*CREATE, "--request-id", str(request_id))

    busy = exports_cli(*args, "--lock-timeout", "0.2", expect=EXIT_BUSY)

    one_line_error(busy)
    assert str(request_id) in busy.stderr
    holder.rollback()
    assert exports_of(admin) == []
    created = exports_cli(*args, "--json").json
    assert created["replay"] is False and [str(j["id"]) for j in exports_of(admin)] == [created["job_id"]]


def test_replace_twice_with_one_request_id_queues_one_replacement(exports_cli, admin, seed, tenant):
    from app.store.types import Status

    original = seed.finished(Status.OUTCOME_UNKNOWN, seed.queued(tenant.id, tenant.destination_id))
    args = ("replace", str(original.id), "--tenant", "Initech", "--by", "alice", "--reason", "partner lost it",
            "--request-id", str(uuid.uuid4()), "--json")

    first, second = exports_cli(*args).json, exports_cli(*args).json

    assert first["job_id"] == second["job_id"] and (first["replay"], second["replay"]) == (False, True)
    assert admin.execute("SELECT count(*) AS n FROM export_jobs WHERE replaces_job_id = %s",
                         (original.id,)).fetchone()["n"] == 1
