"""Permissions of the webhooks: the notifier moves a delivery's sending state and records attempts, and
nothing else; the application and the reconciler insert deliveries with outcomes and never change them;
attempts are append-only for everyone, the owner included."""

from __future__ import annotations

import uuid

import pytest
from psycopg import errors as pg

from app.store import webhooks
from app.store.types import Role, Status
from tests.factories_more import catalog_database


@pytest.fixture(scope="module")
def catalog(pg_server_url, template_db):
    with catalog_database(pg_server_url, template_db) as conn:
        yield conn


def _column(catalog, role: Role, table: str, column: str, privilege: str) -> bool:
    return catalog.execute("SELECT has_column_privilege(%s, %s, %s, %s) AS ok",
                           (role.value, table, column, privilege)).fetchone()["ok"]


def _table(catalog, role: Role, table: str, privilege: str) -> bool:
    return catalog.execute("SELECT has_table_privilege(%s, %s, %s) AS ok",
                           (role.value, table, privilege)).fetchone()["ok"]


def test_the_notifier_may_change_only_a_delivery_s_sending_state(catalog):
    columns = [r["column_name"] for r in catalog.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'webhook_deliveries'")]

    updatable = sorted(c for c in columns if _column(catalog, Role.NOTIFIER, "webhook_deliveries", c, "UPDATE"))

    assert updatable == ["attempts", "finished_at", "next_attempt_at", "state"]
    assert not _table(catalog, Role.NOTIFIER, "webhook_deliveries", "INSERT")
    assert not _table(catalog, Role.NOTIFIER, "webhook_deliveries", "DELETE")
    assert not _table(catalog, Role.NOTIFIER, "webhook_endpoints", "UPDATE")


def test_the_notifier_reads_only_the_job_s_columns_a_body_needs(catalog):
    readable = sorted(c["column_name"] for c in catalog.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'export_jobs'")
        if _column(catalog, Role.NOTIFIER, "export_jobs", c["column_name"], "SELECT"))

    assert readable == ["attempt_count", "delivery_key", "expected_file_bytes", "expected_file_sha256", "id",
                        "replaces_job_id", "tenant_id"]
    assert not any(_table(catalog, Role.NOTIFIER, t, "SELECT") for t in
                   ("export_attempt_events", "cancellation_requests", "outbox", "contacts", "destinations"))


@pytest.mark.parametrize("role", [Role.APP, Role.RECONCILER, Role.DISPATCHER])
def test_no_other_role_changes_a_delivery_or_writes_an_attempt(catalog, role):
    assert not _table(catalog, role, "webhook_deliveries", "UPDATE")
    assert not _table(catalog, role, "webhook_deliveries", "DELETE")
    assert not _table(catalog, role, "webhook_attempts", "INSERT")
    assert _table(catalog, role, "webhook_deliveries", "INSERT") is (role is not Role.DISPATCHER)


def test_an_attempt_cannot_be_changed_or_deleted_even_by_the_owner(seed, conn, connect_as, admin):
    tenant = seed.tenant()
    webhooks.add_endpoint(conn, endpoint_id=uuid.uuid4(), endpoint=webhooks.NewEndpoint(
        tenant_id=tenant, name="prod", url="https://h.example/", secret_ref="env:H", created_by="t"))
    seed.finished(Status.COMPLETED, seed.queued(tenant))
    notifier = connect_as(Role.NOTIFIER)
    (claimed,) = webhooks.claim_batch(notifier, batch_size=1, lease_seconds=60)
    webhooks.record_attempt(notifier, delivery_id=claimed.id, attempt=1, sender="t", started_at=claimed.occurred_at,
                            http_status=503, error="HTTP 503", delivered=False, retry_in_seconds=1,
                            give_up_seconds=60)

    for statement in ("UPDATE webhook_attempts SET http_status = 204", "DELETE FROM webhook_attempts",
                      "TRUNCATE webhook_attempts"):
        with pytest.raises(pg.InsufficientPrivilege):
            admin.execute(statement)
    with pytest.raises(pg.InsufficientPrivilege):
        notifier.execute("UPDATE webhook_deliveries SET status = 'Failed', failure_reason = 'NotDelivered'")

    assert [(a["attempt"], a["http_status"]) for a in admin.execute("SELECT * FROM webhook_attempts")] == [(1, 503)]
