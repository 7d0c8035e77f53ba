"""The credential check, run as the real console script against the embedded SFTP server: ``destination
check-credential`` logs in with the pinned key; ``destination add`` and ``edit --credential`` check before
they record and refuse a reference that does not resolve (2), a login the server refuses (77) or a server
that cannot be reached (69), writing nothing, unless ``--no-check``; contract flags are edited with their
event; a secret is never echoed."""

from __future__ import annotations

import json
import socket

import pytest

from app.cli.common import EXIT_BAD_INPUT, EXIT_LOGIN_REFUSED, EXIT_NOT_FOUND, EXIT_UNREACHABLE
from tests.acceptance.test_cli import one_line_error, snapshot
from tests.fixtures.processes import ExportsCli
from tests.fixtures.sftp import PASSWORD_ENV
from tests.fixtures.worker import insert_destination


@pytest.fixture
def peer_cli(exports_cli, embedded_sftp) -> ExportsCli:
    """The command line with the partner's password in its environment, as the workers have it."""
    return ExportsCli({**exports_cli.env, **embedded_sftp.environ})


@pytest.fixture
def partner(seed, conn, embedded_sftp):
    """Tenant 'Initech' and its destination 'partner' on the embedded server (credential env:...PASSWORD)."""
    tenant_id = seed.tenant("Initech")
    return insert_destination(conn, tenant_id, embedded_sftp.config)


def _add(embedded_sftp, *more: str) -> list[str]:
    config = embedded_sftp.config
    return ["destination", "add", "--tenant", "Initech", "--name", "second", "--host", config.host, "--port",
            str(config.port), "--username", config.username, "--remote-dir", "/inbox", "--host-key",
            config.host_key, *more]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(admin) -> list[tuple[str, str | None]]:
    return [(r["kind"], r["detail"]) for r in
            admin.execute("SELECT kind, detail FROM directory_events ORDER BY id").fetchall()]


def test_check_credential_logs_in_with_the_pinned_key(peer_cli, partner, embedded_sftp):
    checked = peer_cli("destination", "check-credential", "partner", "--tenant", "Initech", "--json").json
    text = peer_cli("destination", "check-credential", "--destination", "partner", "--tenant", "Initech").stdout

    assert (checked["logged_in"], checked["credential"], checked["username"]) == (True, "env:...", "partner")
    assert "logged in to" in text and embedded_sftp.environ[PASSWORD_ENV] not in text


def test_check_credential_answers_2_for_a_reference_that_does_not_resolve_here(exports_cli, partner):
    result = exports_cli("destination", "check-credential", "partner", "--tenant", "Initech", expect=EXIT_BAD_INPUT)

    one_line_error(result)
    assert f"credential env:{PASSWORD_ENV} is not set" in result.stderr


def test_check_credential_answers_77_when_the_server_refuses_the_password(exports_cli, partner):
    wrong = ExportsCli({**exports_cli.env, PASSWORD_ENV: "not-the-password"})

    result = wrong("destination", "check-credential", "partner", "--tenant", "Initech", "--json",
                   expect=EXIT_LOGIN_REFUSED)

    error = json.loads(result.stderr)
    assert "refused the login as partner" in error["error"] and "not-the-password" not in result.stderr


def test_check_credential_answers_69_when_the_server_cannot_be_reached(peer_cli, admin, partner):
    port = _closed_port()
    key = admin.execute("SELECT host_key FROM destinations").fetchone()["host_key"].split(None, 1)[1]
    admin.execute("UPDATE destinations SET port = %s, host_key = %s", (port, f"[127.0.0.1]:{port} {key}"))

    result = peer_cli("destination", "check-credential", "partner", "--tenant", "Initech", expect=EXIT_UNREACHABLE)

    one_line_error(result)
    assert "cannot be reached" in result.stderr


def test_check_credential_of_another_tenants_destination_is_not_found(peer_cli, seed, partner):
    seed.tenant("Globex")
    result = peer_cli("destination", "check-credential", "partner", "--tenant", "Globex", expect=EXIT_NOT_FOUND)
    one_line_error(result)


def test_destination_add_checks_the_credential_before_it_records_the_destination(peer_cli, admin, partner,
                                                                                 embedded_sftp):
    added = peer_cli(*_add(embedded_sftp, "--credential-ref", f"env:{PASSWORD_ENV}", "--json")).json

    assert added["credential_checked"] is True
    row = admin.execute("SELECT credential_ref FROM destinations WHERE id = %s", (added["destination_id"],)).fetchone()
    assert row == {"credential_ref": f"env:{PASSWORD_ENV}"}


@pytest.mark.parametrize(("ref", "environ", "code", "says"), [
    ("env:NOPE", {}, EXIT_BAD_INPUT, "credential env:NOPE is not set"),
    (f"env:{PASSWORD_ENV}", {PASSWORD_ENV: "wrong"}, EXIT_LOGIN_REFUSED, "refused the login"),
    ("keyfile:/nonexistent/key", {}, EXIT_BAD_INPUT, "not a readable unencrypted private key"),
])
def test_destination_add_refuses_a_credential_that_does_not_log_in_and_writes_nothing(
        exports_cli, admin, partner, embedded_sftp, ref, environ, code, says):
    cli = ExportsCli({**exports_cli.env, **environ})
    before = snapshot(admin)

    result = cli(*_add(embedded_sftp, "--credential-ref", ref), expect=code)

    one_line_error(result)
    assert says in result.stderr and "nothing written" in result.stderr
    assert snapshot(admin) == before


def test_destination_add_with_no_check_records_a_reference_for_a_server_not_up_yet(exports_cli, admin, partner,
                                                                                  embedded_sftp):
    added = exports_cli(*_add(embedded_sftp, "--credential-ref", "env:NOPE", "--no-check"))

    assert "credential not checked (--no-check)" in added.stdout
    recorded = admin.execute("SELECT count(*) AS n FROM destinations WHERE credential_ref = 'env:NOPE'").fetchone()
    assert recorded["n"] == 1


def test_destination_edit_changes_the_credential_reference_after_logging_in_with_it_and_records_who(
        peer_cli, admin, partner, embedded_sftp):
    cli = ExportsCli({**peer_cli.env, "ROTATED_PASSWORD": embedded_sftp.environ[PASSWORD_ENV]})

    edited = cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--credential",
                 "env:ROTATED_PASSWORD", "--by", "ops-alice", "--reason", "vault rotation", "--json").json

    assert (edited["credential_changed"], edited["credential_checked"]) == (True, True)
    row = admin.execute("SELECT credential_ref FROM destinations").fetchone()
    assert row == {"credential_ref": "env:ROTATED_PASSWORD"}
    assert _events(admin) == [("CredentialChanged", f"env:{PASSWORD_ENV} -> env:ROTATED_PASSWORD")]
    # The same reference again changes nothing.
    again = cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--credential",
                "env:ROTATED_PASSWORD", "--json").json
    assert again["changed"] is False and len(_events(admin)) == 1


@pytest.mark.parametrize(("ref", "code", "says"), [
    ("env:NOPE", EXIT_BAD_INPUT, "credential env:NOPE is not set"),
    ("hunter2", EXIT_BAD_INPUT, "a credential reference must be"),
])
def test_destination_edit_refuses_a_credential_that_does_not_resolve_and_writes_nothing(
        peer_cli, admin, partner, ref, code, says):
    before = snapshot(admin)

    result = peer_cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--credential", ref,
                      expect=code)

    one_line_error(result)
    assert says in result.stderr and "hunter2" not in result.stderr
    assert snapshot(admin) == before and _events(admin) == []


def test_destination_edit_sets_contract_flags_with_their_event_and_show_prints_them(peer_cli, admin, partner):
    edited = peer_cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--remote-hash",
                      "--name-and-size-identify", "--by", "ops-alice", "--json").json

    assert edited["contract"] == {"remote_hash": True, "acknowledgments": False, "name_and_size_identify": True,
                                  "read_back": False}
    assert _events(admin) == [("ContractChanged", "remote_hash: false -> true, name_and_size_identify: false -> true")]
    unset = peer_cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--no-remote-hash",
                     "--json").json
    assert unset["contract"]["remote_hash"] is False
    shown = peer_cli("destination", "show", "--tenant", "Initech", "--destination", "partner", "--json").json
    assert shown["contract"] == {"remote_hash": False, "acknowledgments": False, "name_and_size_identify": True,
                                 "read_back": False}


def test_destination_edit_max_sessions_changes_the_sessions_at_once_and_refuses_a_bad_count(peer_cli, partner, admin):
    edited = peer_cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--max-sessions", "2",
                      "--json").json
    again = peer_cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--max-sessions", "2",
                     "--json").json
    shown = peer_cli("destination", "show", "--tenant", "Initech", "--destination", "partner", "--json").json
    bad = [peer_cli("destination", "edit", "--tenant", "Initech", "--destination", "partner", "--max-sessions", n,
                    expect=EXIT_BAD_INPUT) for n in ("0", "65", "two")]

    assert (edited["changed"], edited["max_sessions"], again["changed"], shown["max_sessions"]) == (True, 2, False, 2)
    assert admin.execute("SELECT max_sessions FROM destinations").fetchone()["max_sessions"] == 2
    for result in bad:
        one_line_error(result)
