"""``exports operator revoke`` and ``operator list``: a revoked operator is refused like one never granted,
and the grant stays on record; granting again is a new period beside it."""

from __future__ import annotations

import pytest
from psycopg import errors as pg

from app.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED
from app.store import directory
from app.store.types import Status
from tests.acceptance.test_cli import grant, one_line_error, snapshot


@pytest.fixture
def initech(seed, conn):
    tenant_id = seed.tenant("Initech")
    destination_id = seed.destination(tenant_id)
    grant(conn, tenant_id, "alice")
    grant(conn, tenant_id, "bob", reconciliation=True)
    return tenant_id, destination_id


def test_a_revoked_operators_cancel_and_create_are_refused_like_an_ungranted_ones(exports_cli, seed, initech):
    job = seed.queued(*initech)
    revoked = exports_cli("operator", "revoke", "alice", "--tenant", "Initech", "--by", "root", "--json").json
    assert (revoked["result"], revoked["revoked_by"], revoked["reconciliation"]) == ("Revoked", "root", False)

    refusals = [exports_cli("cancel", str(job.id), "--tenant", "Initech", "--by", who, expect=EXIT_REFUSED)
                for who in ("alice", "mallory")]
    create = exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "alice",
                         expect=EXIT_REFUSED)

    for result in (*refusals, create):
        one_line_error(result)
    assert refusals[0].stderr.replace("alice", "X") == refusals[1].stderr.replace("mallory", "X")
    assert seed.status(job) is Status.QUEUED
    exports_cli("cancel", str(job.id), "--tenant", "Initech", "--by", "bob")   # bob's grant is untouched
    assert seed.status(job) is Status.CANCELED


def test_a_revoke_keeps_the_grant_as_history_and_a_new_grant_is_a_new_period(exports_cli, admin, initech):
    exports_cli("operator", "revoke", "alice", "--tenant", "Initech", "--by", "root")
    exports_cli("operator", "grant", "--operator", "alice", "--tenant", "Initech", "--reconciliation")

    live = exports_cli("operator", "list", "--tenant", "Initech", "--json").json["grants"]
    every = exports_cli("operator", "list", "--tenant", "Initech", "--revoked", "--json").json["grants"]
    text = exports_cli("operator", "list", "--tenant", "Initech", "--revoked").stdout

    assert [(g["operator"], g["reconciliation"]) for g in live] == [("alice", True), ("bob", True)]
    assert [(g["operator"], g["live"], g["revoked_by"]) for g in every] == [
        ("alice", False, "root"), ("alice", True, None), ("bob", True, None)]
    assert "revoked by" in text and "root" in text
    rows = admin.execute("SELECT count(*) AS n FROM operator_access WHERE operator_id = 'alice'").fetchone()
    assert rows["n"] == 2


def test_revoking_an_operator_without_a_grant_changes_nothing_and_says_so(exports_cli, admin, initech):
    exports_cli("operator", "revoke", "alice", "--tenant", "Initech", "--by", "root")
    before = snapshot(admin)

    again = exports_cli("operator", "revoke", "alice", "--tenant", "Initech", "--by", "root", expect=EXIT_OK)
    never = exports_cli("operator", "revoke", "mallory", "--tenant", "Initech", "--json").json

    assert "holds no grant" in again.stdout and never["result"] == "NotGranted"
    assert snapshot(admin) == before


@pytest.mark.parametrize("argv, code", [
    (("operator", "revoke", "alice", "--tenant", "Globex"), EXIT_NOT_FOUND),
    (("operator", "revoke", "al\x01ice", "--tenant", "Initech"), EXIT_BAD_INPUT),
    (("operator", "revoke", "alice", "--tenant", "Initech", "--by", "x" * 201), EXIT_BAD_INPUT),
    (("operator", "list", "--tenant", "00000000-0000-0000-0000-000000000000"), EXIT_NOT_FOUND),
])
def test_bad_input_to_revoke_or_list_is_one_line_and_changes_nothing(exports_cli, admin, initech, argv, code):
    before = snapshot(admin)

    result = exports_cli(*argv, expect=code)

    one_line_error(result)
    assert snapshot(admin) == before


def test_the_database_keeps_one_live_grant_per_operator_and_tenant_and_no_role_deletes_a_grant(conn, initech):
    tenant_id, _ = initech
    first = directory.revoke_operator(conn, operator_id="alice", tenant_id=tenant_id, revoked_by="root")
    assert first is not None and first.revoked_at >= first.granted_at
    assert directory.revoke_operator(conn, operator_id="alice", tenant_id=tenant_id, revoked_by="root") is None
    assert directory.grant_operator(conn, operator_id="alice", tenant_id=tenant_id,
                                    reconciliation=False) is directory.GrantResult.GRANTED
    assert directory.grant_operator(conn, operator_id="alice", tenant_id=tenant_id,
                                    reconciliation=False) is directory.GrantResult.ALREADY_GRANTED

    with pytest.raises(pg.UniqueViolation):
        conn.execute("INSERT INTO operator_access (operator_id, tenant_id) VALUES ('alice', %s)", (tenant_id,))
    with pytest.raises(pg.InsufficientPrivilege):
        conn.execute("DELETE FROM operator_access")
