"""The application role's grants on tenants, destinations and their history follow the operator's verbs
exactly: it may change a destination's pause, credential reference, contract flags and the settings earlier
verbs change, a tenant's pause, and nothing else of either; directory_events it may only read and insert."""

from __future__ import annotations

import pytest

from app.store.types import Role
from tests.factories_more import catalog_database

#: The destination columns the application role may update, and the verbs that do.
DESTINATION_UPDATABLE = {
    "active", "profile_version", "file_sequence", "host_key", "more_host_keys", "delivery_mode", "bandwidth_limit",
    "credential_ref", "remote_hash", "acknowledgments", "name_and_size_identify", "read_back",   # edit
    "pause_state", "paused_by", "paused_reason", "paused_at",                                     # pause, drain
    "max_sessions",                                                                               # edit (0015)
}
TENANT_UPDATABLE = {"paused_by", "paused_reason", "paused_at"}


@pytest.fixture(scope="module")
def catalog(pg_server_url, template_db):
    with catalog_database(pg_server_url, template_db) as conn:
        yield conn


def _updatable(catalog, table: str) -> set[str]:
    rows = catalog.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = %s"
        " AND has_column_privilege(%s, quote_ident(table_name), column_name, 'UPDATE')",
        (table, Role.APP.value)).fetchall()
    return {r["column_name"] for r in rows}


def test_the_application_role_updates_exactly_the_destination_columns_its_verbs_change(catalog):
    assert _updatable(catalog, "destinations") == DESTINATION_UPDATABLE


def test_the_application_role_updates_only_a_tenants_pause(catalog):
    assert _updatable(catalog, "tenants") == TENANT_UPDATABLE


@pytest.mark.parametrize(("privilege", "held"), [("SELECT", True), ("INSERT", True), ("UPDATE", False),
                                                 ("DELETE", False), ("TRUNCATE", False)])
def test_the_application_role_only_reads_and_appends_directory_events(catalog, privilege, held):
    ok = catalog.execute("SELECT has_table_privilege(%s, 'directory_events', %s) AS ok",
                         (Role.APP.value, privilege)).fetchone()["ok"]
    assert ok is held
    assert _updatable(catalog, "directory_events") == set()
