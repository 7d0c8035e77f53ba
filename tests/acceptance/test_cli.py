"""The ``exports`` operator scripts, run as the real console script against a real PostgreSQL.

Every happy path once; every bad input answers its exit code with exactly one line on stderr, no
traceback, and leaves every table as it was.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import psycopg
import pytest

from app.cli.common import EXIT_BAD_INPUT, EXIT_BUSY, EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED
from app.cli.main import build_parser
from app.store import directory, export, partner
from app.store.database import connect
from app.store.types import FailureCode, Role, Status
from exports_devtools.processes import clean_environ
from tests.fixtures.processes import CliResult, ExportsCli

TABLES = ("tenants", "destinations", "contacts", "operator_access", "export_jobs", "deliveries",
          "export_attempt_events", "cancellation_requests", "outbox", "create_requests", "schedules", "schedule_runs")


def snapshot(admin: psycopg.Connection) -> dict[str, list]:
    """Every row of every table, so "changes nothing" is checked, not assumed."""
    return {t: admin.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES}


def one_line_error(result) -> None:
    assert "Traceback" not in result.stderr, str(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("exports"), str(result)


@dataclass(frozen=True)
class Tenant:
    id: uuid.UUID
    destination_id: uuid.UUID


@pytest.fixture
def tenant(seed, conn) -> Tenant:
    """Tenant 'Initech' with one destination, 'partner', and operator 'alice' granted for it."""
    tenant_id = seed.tenant("Initech")
    destination_id = seed.destination(tenant_id)
    grant(conn, tenant_id, "alice")
    return Tenant(tenant_id, destination_id)


@pytest.fixture
def queued(seed, tenant):
    """Queues an export of Initech's to 'partner'."""
    return lambda: seed.queued(tenant.id, tenant.destination_id)


def grant(conn, tenant_id, operator, reconciliation=False):
    assert directory.grant_operator(conn, operator_id=operator, tenant_id=tenant_id,
                                    reconciliation=reconciliation) is directory.GrantResult.GRANTED


# --- help ----------------------------------------------------------------------------------------


def _leaves(parser, prefix=()):
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in action.choices.items():
            if sub._subparsers:
                yield from _leaves(sub, prefix + (name,))
            else:
                yield prefix + (name,), sub


#: The commands that print no document, and so offer no --json: the long-running processes, and the
#: preview, which prints the partner's file itself.
PROCESSES = {("relay",), ("scheduler",), ("worker",), ("notifier",), ("demo",), ("preview",)}
#: The commands whose submissions carry a request id, so a busy answer can be retried safely.
REQUEST_ID_TAKERS = {("cancel",), ("create",), ("replace",)}


def test_every_command_has_help_that_lists_its_exit_codes_and_json_where_it_prints_a_document():
    leaves = dict(_leaves(build_parser()))
    assert {("cancel",), ("db", "migrate"), ("contacts", "generate"), ("worker",), ("demo",)} <= set(leaves)
    for path, parser in leaves.items():
        text = parser.format_help()
        assert "exit codes:" in text and f"  {EXIT_OK}   done" in text, path
        # Only cancel, create and replace can answer busy, and only they take the --request-id a retry needs.
        assert ("busy" in text) is ("--request-id" in text) is (path in REQUEST_ID_TAKERS), path
        assert ("--json" in text) is (path not in PROCESSES), path


def test_help_runs_as_the_console_script(exports_cli):
    result = exports_cli("cancel", "--help")
    assert "--request-id" in result.stdout and "exit codes" in result.stdout
    assert f"  {EXIT_BUSY}  busy: nothing recorded; retry with the same --request-id" in result.stdout

    listing = exports_cli("list", "--help")
    assert "exit codes" in listing.stdout and "busy" not in listing.stdout and "request" not in listing.stdout


# --- setup ---------------------------------------------------------------------------------------


def test_db_migrate_on_a_migrated_database_changes_nothing(exports_cli, admin):
    before = snapshot(admin)
    assert exports_cli("db", "migrate", "--json").json == {"applied": False}
    assert snapshot(admin) == before


def test_tenant_add_prints_the_new_tenant_id(exports_cli, admin):
    created = exports_cli("tenant", "add", "Globex", "--json").json
    row = admin.execute("SELECT name FROM tenants WHERE id = %s", (created["tenant_id"],)).fetchone()
    assert row == {"name": "Globex"}


def test_destination_add_pins_the_given_host_key_and_stores_only_a_credential_reference(exports_cli, admin, seed):
    seed.tenant("Initech")
    line = "[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    created = exports_cli("destination", "add", "--no-check",
                          "--tenant", "Initech", "--name", "partner", "--host", "127.0.0.1",
                          "--port", "2222", "--username", "p", "--remote-dir", "/inbox", "--credential-ref",
                          "env:PARTNER_PW", "--host-key", line, "--remote-hash", "--json").json
    row = admin.execute("SELECT * FROM destinations WHERE id = %s", (created["destination_id"],)).fetchone()
    assert (row["host_key"], row["credential_ref"], row["remote_hash"], row["read_back"]) == (
        line, "env:PARTNER_PW", True, False)


def test_destination_add_records_the_partners_session_limit_and_automatic_retries(exports_cli, admin, seed):
    seed.tenant("Initech")
    line = "[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    args = ["destination", "add", "--no-check",
            "--tenant", "Initech", "--host", "127.0.0.1", "--port", "2222", "--username", "p",
            "--remote-dir", "/inbox", "--credential-ref", "env:PW", "--host-key", line]
    limited = exports_cli(*args, "--name", "limited", "--max-sessions", "2", "--auto-retries", "0", "--json").json
    default = exports_cli(*args, "--name", "default", "--json").json

    rows = {r["id"]: r for r in admin.execute("SELECT id, max_sessions, auto_retries FROM destinations").fetchall()}
    assert (rows[uuid.UUID(limited["destination_id"])]["max_sessions"],
            rows[uuid.UUID(limited["destination_id"])]["auto_retries"]) == (2, 0)
    assert (rows[uuid.UUID(default["destination_id"])]["max_sessions"],
            rows[uuid.UUID(default["destination_id"])]["auto_retries"]) == (4, 3)
    before = snapshot(admin)
    for bad in (["--max-sessions", "0"], ["--max-sessions", "65"], ["--auto-retries", "21"], ["--auto-retries", "-1"]):
        one_line_error(exports_cli(*args, "--name", "bad", *bad, expect=EXIT_BAD_INPUT))
    assert snapshot(admin) == before


def test_destination_status_shows_each_circuit_the_sessions_in_use_and_the_deferred_exports(
        exports_cli, seed, tenant, queued, conn, db_url):
    deferred = seed.running(queued())
    assert export.try_defer(conn, job_id=deferred.id, attempt_id=deferred.attempt_id, worker_id="w",
                            cause="connecting: ConnectionRefusedError: refused", delay_seconds=60) == 1
    partner.record_failure(conn, destination_id=tenant.destination_id, attempt_id=deferred.attempt_id,
                           error="connecting: ConnectionRefusedError: refused", base_seconds=5, max_seconds=60)
    holder = connect(db_url, Role.APP)
    try:
        assert partner.try_slot(holder, destination_id=tenant.destination_id, slot=1)
        shown = exports_cli("destination", "status", "--tenant", "Initech", "--json").json
        text = exports_cli("destination", "status").stdout
    finally:
        holder.close()

    assert len(shown) == 1
    status = shown[0]
    assert (status["destination_id"], status["circuit"], status["sessions_in_use"], status["max_sessions"]) == (
        str(tenant.destination_id), "open", 1, 4)
    assert (status["deferred_jobs"], status["auto_retries"], status["failures"]) == (1, 3, 1)
    assert status["last_error"] == "connecting: ConnectionRefusedError: refused"
    assert "open" in text and "1/4" in text and "ConnectionRefusedError" in text
    one_line_error(exports_cli("destination", "status", "--tenant", "Nobody", expect=EXIT_NOT_FOUND))


def test_show_prints_how_often_an_export_was_deferred_and_why(exports_cli, seed, tenant, queued, conn):
    job = seed.running(queued())
    assert export.try_defer(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                            cause="circuit open", delay_seconds=60) == 1

    shown = exports_cli("show", str(job.id), "--tenant", "Initech", "--json").json
    text = exports_cli("show", str(job.id), "--tenant", "Initech").stdout

    assert (shown["job"]["deferrals"], shown["job"]["last_deferral"]) == (1, "circuit open")
    assert [e["kind"] for e in shown["events"]] == ["Claimed", "DeferredPartnerUnavailable"]
    assert shown["outbox"][-1]["due_at"] is not None
    assert "deferred 1 times since" in text and "last: circuit open" in text


def test_destination_add_refuses_a_host_key_line_for_another_port(exports_cli, admin, seed):
    seed.tenant("Initech")
    before = snapshot(admin)
    result = exports_cli("destination", "add", "--no-check",
                         "--tenant", "Initech", "--name", "partner", "--host", "127.0.0.1",
                         "--port", "2222", "--username", "p", "--remote-dir", "/inbox", "--credential-ref", "env:PW",
                         "--host-key", "[127.0.0.1]:22 ssh-ed25519 "
                                       "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
                         expect=EXIT_BAD_INPUT)
    one_line_error(result)
    assert snapshot(admin) == before


def test_destination_add_fetches_the_host_key_but_pins_it_only_with_yes(exports_cli, admin, seed, embedded_sftp):
    seed.tenant("Initech")
    port = str(embedded_sftp.config.port)
    args = ["destination", "add", "--no-check",
            "--tenant", "Initech", "--name", "partner", "--host", "127.0.0.1", "--port", port,
            "--username", "partner", "--remote-dir", "/inbox", "--credential-ref", "env:PW", "--fetch-host-key"]
    unconfirmed = exports_cli(*args, expect=EXIT_REFUSED)
    one_line_error(unconfirmed)
    assert "--yes" in unconfirmed.stderr
    assert admin.execute("SELECT count(*) AS n FROM destinations").fetchone()["n"] == 0
    pinned = exports_cli(*args, "--yes", "--json").json
    assert pinned["host_key"] == embedded_sftp.config.host_key


def test_operator_grant_lets_the_operator_act_for_the_tenant(exports_cli, admin, seed):
    tenant_id = seed.tenant("Initech")
    seed.destination(tenant_id)
    exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "carol", expect=EXIT_REFUSED)
    exports_cli("operator", "grant", "--operator", "carol", "--tenant", str(tenant_id))
    exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "carol")
    assert admin.execute("SELECT created_by FROM export_jobs").fetchall() == [{"created_by": "carol"}]


def test_a_repeated_grant_changes_nothing_and_a_different_one_is_refused(exports_cli, admin, tenant):
    before = snapshot(admin)
    assert exports_cli("operator", "grant", "--operator", "alice", "--tenant", "Initech", "--json").json["result"] == \
        "AlreadyGranted"
    widened = exports_cli("operator", "grant", "--operator", "alice", "--tenant", "Initech", "--reconciliation",
                          expect=EXIT_REFUSED)
    one_line_error(widened)
    assert snapshot(admin) == before


def _import_refused(exports_cli, admin, path) -> CliResult:
    """``contacts import`` of ``path``: refused as bad input in one line, with nothing loaded."""
    before = snapshot(admin)
    result = exports_cli("contacts", "import", str(path), "--tenant", "Initech", expect=EXIT_BAD_INPUT)
    one_line_error(result)
    assert snapshot(admin) == before
    return result


def test_contacts_import_loads_every_row_of_the_file(exports_cli, admin, tenant, tmp_path):
    path = tmp_path / "contacts.csv"
    path.write_text("email,full_name,company,phone,consent\n"
                    "ada@example.com,Ada Lovelace,Analytical,+44 1,yes\n"
                    "alan@example.com,\"Turing, Alan\",,,no\n", encoding="utf-8")
    assert exports_cli("contacts", "import", str(path), "--tenant", "Initech", "--json").json["imported"] == 2
    rows = admin.execute("SELECT email, full_name, company, consent FROM contacts ORDER BY id").fetchall()
    assert rows == [
        {"email": "ada@example.com", "full_name": "Ada Lovelace", "company": "Analytical", "consent": True},
        {"email": "alan@example.com", "full_name": "Turing, Alan", "company": None, "consent": False},
    ]


def test_contacts_import_with_a_nul_byte_in_one_row_loads_nothing(exports_cli, admin, tenant, tmp_path):
    path = tmp_path / "contacts.csv"
    path.write_bytes(b"email,full_name\nada@example.com,Ada\nbad@example.com,B\x00ad\n")
    assert "line 3" in _import_refused(exports_cli, admin, path).stderr


def test_contacts_import_keeps_multi_line_and_tabbed_values_and_refuses_other_control_characters(
        exports_cli, admin, tenant, tmp_path):
    path = tmp_path / "contacts.csv"
    path.write_text('email,full_name,company\n'
                    'ada@example.com,"Ada\tLovelace","Analytical Engines\r\nLondon office"\n', encoding="utf-8")
    assert exports_cli("contacts", "import", str(path), "--tenant", "Initech", "--json").json["imported"] == 1
    assert admin.execute("SELECT full_name, company FROM contacts").fetchone() == {
        "full_name": "Ada\tLovelace", "company": "Analytical Engines\r\nLondon office"}

    bell = tmp_path / "bell.csv"
    bell.write_text('email,full_name\nalan@example.com,Alan\nbell@example.com,"Ring\x07"\n', encoding="utf-8")
    assert "line 3: full_name contains control characters" in _import_refused(exports_cli, admin, bell).stderr


def test_contacts_import_keeps_the_extra_columns_as_the_contacts_custom_fields(exports_cli, admin, tenant, tmp_path):
    path = tmp_path / "contacts.csv"
    path.write_text("email,full_name,Loyalty tier,region\n"
                    "ada@example.com,Ada,Gold,\"EMEA\nNorth\"\n"
                    "alan@example.com,Alan,,APAC\n", encoding="utf-8")
    assert exports_cli("contacts", "import", str(path), "--tenant", "Initech", "--json").json["imported"] == 2
    rows = admin.execute("SELECT email, attributes FROM contacts ORDER BY id").fetchall()
    assert rows == [{"email": "ada@example.com", "attributes": {"Loyalty tier": "Gold", "region": "EMEA\nNorth"}},
                    {"email": "alan@example.com", "attributes": {"region": "APAC"}}]   # an empty cell: no field


@pytest.mark.parametrize("header", ["email,full_name,tier,tier", "email,full_name,", "email,full_name, tier"])
def test_contacts_import_with_a_custom_column_unnamed_twice_named_or_padded_loads_nothing(
        exports_cli, admin, tenant, tmp_path, header):
    path = tmp_path / "contacts.csv"
    path.write_text(f"{header}\nada@example.com,Ada,a,b\n", encoding="utf-8")
    result = _import_refused(exports_cli, admin, path)
    assert "column" in result.stderr and "line" not in result.stderr   # the header is refused, not a row


def test_contacts_generate_loads_the_requested_count(exports_cli, admin, tenant):
    exports_cli("contacts", "generate", "--tenant", "Initech", "--count", "2500")
    counts = admin.execute("SELECT count(*) AS n, count(DISTINCT email) AS emails, "
                           "bool_or(NOT consent) AS some_refused "
                           "FROM contacts WHERE tenant_id = %s", (tenant.id,)).fetchone()
    assert counts == {"n": 2500, "emails": 2500, "some_refused": True}


# --- exports -------------------------------------------------------------------------------------


def test_create_queues_an_export_with_its_delivery_and_one_wakeup(exports_cli, admin, tenant):
    created = exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "alice", "--json").json
    job = admin.execute("SELECT * FROM export_jobs WHERE id = %s", (created["job_id"],)).fetchone()
    assert (job["status"], job["created_by"], job["delivery_key"]) == ("Queued", "alice", created["delivery_key"])
    assert uuid.UUID(hex=job["delivery_key"]).version == 4
    assert admin.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (job["id"],)).fetchone()["n"] == 1


def test_create_by_an_operator_without_a_grant_is_refused_and_creates_nothing(exports_cli, admin, tenant):
    before = snapshot(admin)
    result = exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "mallory",
                         expect=EXIT_REFUSED)
    one_line_error(result)
    assert "not allowed" in result.stderr
    assert snapshot(admin) == before


def test_cancel_of_a_queued_export_cancels_it_and_prints_the_minted_request_id(exports_cli, seed, tenant, queued):
    job, bystander = queued(), queued()
    answer = exports_cli("cancel", str(job.id), "--tenant", "Initech", "--by", "alice", "--json").json
    assert (answer["outcome"], answer["found_status"]) == ("CanceledWhileQueued", "Queued")
    assert uuid.UUID(answer["request_id"])
    assert seed.row(job)["cancellation_request_id"] == uuid.UUID(answer["request_id"])
    assert (seed.status(bystander), seed.row(bystander)["cancellation_request_id"]) == (Status.QUEUED, None)


def test_the_same_cancel_twice_with_one_request_id_records_once_and_answers_the_same(exports_cli, admin, seed, tenant,
                                                                                    queued):
    job = queued()
    request_id = str(uuid.uuid4())
    args = ("cancel", str(job.id), "--tenant", "Initech", "--by", "alice", "--request-id", request_id, "--json")
    first, second = exports_cli(*args).json, exports_cli(*args, "--reason", "clicked again").json
    replay = {"replay", "recorded_at"}
    assert {k: v for k, v in first.items() if k not in replay} == {k: v for k, v in second.items() if k not in replay}
    assert (first["replay"], second["replay"]) == (False, True) and second["recorded_at"]
    assert first["outcome"] == "CanceledWhileQueued"
    rows = admin.execute("SELECT id, reason FROM cancellation_requests").fetchall()
    assert rows == [{"id": uuid.UUID(request_id), "reason": None}]


def test_cancel_of_another_tenants_export_answers_exactly_like_a_missing_one(exports_cli, admin, seed, tenant, queued):
    theirs = seed.queued()   # another tenant's
    missing = uuid.uuid4()
    before = snapshot(admin)
    results = [exports_cli("cancel", str(job_id), "--tenant", "Initech", "--by", "alice", expect=EXIT_NOT_FOUND)
               for job_id in (theirs.id, missing)]
    for result in results:
        one_line_error(result)
    assert results[0].stderr.replace(str(theirs.id), "JOB").split("request")[0] == \
        results[1].stderr.replace(str(missing), "JOB").split("request")[0]
    assert snapshot(admin) == before


def test_cancel_while_the_row_is_locked_answers_busy_records_nothing_and_the_retry_succeeds(
        exports_cli, admin, seed, tenant, connect_as, queued):
    job = queued()
    request_id = str(uuid.uuid4())
    args = ("cancel", str(job.id), "--tenant", "Initech", "--by", "alice", "--request-id", request_id)
    holder = connect_as(autocommit=False)
    holder.execute("SELECT 1 FROM export_jobs WHERE id = %s FOR UPDATE", (job.id,))
    busy = exports_cli(*args, "--lock-timeout", "0.2", expect=EXIT_BUSY)
    one_line_error(busy)
    assert request_id in busy.stderr
    assert admin.execute("SELECT count(*) AS n FROM cancellation_requests").fetchone()["n"] == 0
    assert seed.status(job) is Status.QUEUED
    holder.rollback()
    assert exports_cli(*args, "--json").json["outcome"] == "CanceledWhileQueued"


def test_cancel_with_a_request_id_used_for_another_export_is_refused(exports_cli, admin, seed, tenant, queued):
    first, second = queued(), queued()
    request_id = str(uuid.uuid4())
    exports_cli("cancel", str(first.id), "--tenant", "Initech", "--by", "alice", "--request-id", request_id)
    before = snapshot(admin)
    reused = exports_cli("cancel", str(second.id), "--tenant", "Initech", "--by", "alice", "--request-id", request_id,
                         expect=EXIT_REFUSED)
    one_line_error(reused)
    assert seed.status(second) is Status.QUEUED
    assert snapshot(admin) == before


def test_cancel_during_delivery_is_recorded_as_too_late_and_exits_zero(exports_cli, seed, tenant, queued):
    job = seed.delivering(queued())
    answer = exports_cli("cancel", str(job.id), "--tenant", "Initech", "--by", "alice", "--json").json
    assert (answer["outcome"], answer["found_status"]) == ("TooLate", "Delivering")
    assert seed.status(job) is Status.DELIVERING


def test_edit_moves_a_queued_export_to_another_destination_at_the_next_version(exports_cli, seed, tenant, queued):
    job, bystander = queued(), queued()
    other = seed.destination(tenant.id)
    answer = exports_cli("edit", str(job.id), "--tenant", "Initech", "--destination", str(other),
                         "--expected-version", "1", "--by", "alice", "--json").json
    assert answer["version"] == 2
    assert (seed.row(job)["destination_id"], seed.row(job)["version"]) == (other, 2)
    assert (seed.row(bystander)["destination_id"], seed.row(bystander)["version"]) == (tenant.destination_id, 1)


def test_edit_at_a_stale_version_is_not_changed(exports_cli, admin, seed, tenant, queued):
    job = queued()
    before = snapshot(admin)
    result = exports_cli("edit", str(job.id), "--tenant", "Initech", "--destination", "partner",
                         "--expected-version", "7", "--by", "alice", expect=EXIT_REFUSED)
    one_line_error(result)
    assert "NotChanged" in result.stderr
    assert snapshot(admin) == before


def test_replace_naming_a_replacement_resolves_to_its_original(exports_cli, seed, tenant, queued):
    original = seed.finished(Status.OUTCOME_UNKNOWN, queued())
    created = exports_cli("replace", str(original.id), "--tenant", "Initech", "--by", "alice",
                          "--reason", "partner lost it", "--json").json
    assert created["original_job_id"] == str(original.id)
    again = exports_cli("replace", created["job_id"], "--tenant", "Initech", "--by", "alice", "--reason", "again",
                        expect=EXIT_REFUSED)
    one_line_error(again)
    assert "SlotTaken" in again.stderr and str(original.id) in again.stderr


def test_replace_of_a_completed_export_is_not_allowed(exports_cli, admin, seed, tenant, queued):
    job = seed.finished(Status.COMPLETED, queued())
    before = snapshot(admin)
    result = exports_cli("replace", str(job.id), "--tenant", "Initech", "--by", "alice", "--reason", "x",
                         expect=EXIT_REFUSED)
    one_line_error(result)
    assert "NotAllowed" in result.stderr
    assert snapshot(admin) == before


def test_reconcile_settles_an_outcome_unknown_attempt_once(exports_cli, seed, tenant, queued):
    job = seed.finished(Status.OUTCOME_UNKNOWN, queued())
    args = ("reconcile", str(job.id), "--tenant", "Initech", "--attempt", str(job.attempt_id), "--to", "Completed",
            "--evidence", "partner confirmed by phone", "--by", "alice")
    exports_cli(*args)
    assert seed.status(job) is Status.COMPLETED
    one_line_error(exports_cli(*args, expect=EXIT_REFUSED))
    assert seed.event_kinds(job).count("Reconciled") == 1


def test_correct_by_a_reconciliation_operator_changes_the_recorded_outcome_once(exports_cli, conn, seed, tenant,
                                                                                queued):
    grant(conn, tenant.id, "rita", reconciliation=True)
    job = seed.finished(Status.COMPLETED, queued())
    exports_cli("correct", str(job.id), "--tenant", "Initech", "--attempt", str(job.attempt_id), "--from", "Completed",
                "--to", "Failed", "--failure-reason", FailureCode.NOT_DELIVERED.value, "--evidence-ref", "TICKET-1",
                "--why", "partner never received it", "--by", "rita")
    assert (seed.status(job), seed.row(job)["failure_reason"]) == (Status.FAILED, "NotDelivered")
    assert seed.event_kinds(job)[-1] == "Corrected"


def test_correct_by_an_operator_without_reconciliation_access_is_refused(exports_cli, admin, seed, tenant, queued):
    job = seed.finished(Status.COMPLETED, queued())
    before = snapshot(admin)
    result = exports_cli("correct", str(job.id), "--tenant", "Initech", "--attempt", str(job.attempt_id),
                         "--from", "Completed", "--to", "Failed", "--failure-reason", "NotDelivered",
                         "--evidence-ref", "T-1", "--why", "x", "--by", "alice", expect=EXIT_REFUSED)
    one_line_error(result)
    assert "reconciliation" in result.stderr
    assert snapshot(admin) == before


def test_show_prints_the_row_events_requests_and_outbox(exports_cli, seed, tenant, queued):
    job = seed.finished(Status.COMPLETED, queued())
    exports_cli("cancel", str(job.id), "--tenant", "Initech", "--by", "alice")
    shown = exports_cli("show", str(job.id), "--tenant", "Initech", "--json").json
    assert shown["job"]["status"] == "Completed"
    assert [e["kind"] for e in shown["events"]] == ["Claimed", "DeliveryAuthorized", "Finished"]
    assert [r["outcome"] for r in shown["cancellation_requests"]] == ["TooLate"]
    assert len(shown["outbox"]) == 1
    assert "Finished" in exports_cli("show", str(job.id), "--tenant", "Initech").stdout


def test_list_filters_by_tenant_and_status(exports_cli, seed, tenant, queued):
    waiting = queued()
    seed.finished(Status.COMPLETED, queued())
    seed.queued()   # another tenant's
    listed = exports_cli("list", "--tenant", "Initech", "--status", "queued", "--json").json
    assert [row["job_id"] for row in listed] == [str(waiting.id)]


def test_watch_once_counts_exports_by_state(exports_cli, seed, tenant, queued):
    queued()
    queued()
    seed.running(queued())
    counts = exports_cli("watch", "--once", "--json").json["counts"]
    assert (counts["Queued"], counts["Running"], counts["Completed"]) == (2, 1, 0)


# --- bad input -----------------------------------------------------------------------------------

MISSING = str(uuid.uuid4())


@pytest.mark.parametrize(("argv", "code"), [
    pytest.param(["cancel", "not-a-uuid", "--tenant", "Initech", "--by", "alice"], EXIT_BAD_INPUT,
                 id="malformed-job-id"),
    pytest.param(["cancel", MISSING, "--tenant", "Initech", "--by", "alice", "--request-id", "123"], EXIT_BAD_INPUT,
                 id="malformed-request-id"),
    pytest.param(["list", "--status", "Finished"], EXIT_BAD_INPUT, id="unknown-status"),
    pytest.param(["tenant", "add", "x" * 10_240], EXIT_BAD_INPUT, id="10kb-name"),
    pytest.param(["tenant", "add", b"\xff\xfe bad bytes"], EXIT_BAD_INPUT, id="invalid-utf8"),
    pytest.param(["create", "--tenant", "Initech", "--destination", "partner", "--by", "al\x1bice"], EXIT_BAD_INPUT,
                 id="escape-character"),
    pytest.param(["show", MISSING, "--tenant", "Initech"], EXIT_NOT_FOUND, id="unknown-job"),
    pytest.param(["create", "--tenant", "Nobody Inc", "--destination", "partner", "--by", "alice"], EXIT_NOT_FOUND,
                 id="unknown-tenant"),
    pytest.param(["create", "--tenant", "Initech", "--destination", "nowhere", "--by", "alice"], EXIT_NOT_FOUND,
                 id="unknown-destination"),
    pytest.param(["reconcile", MISSING, "--tenant", "Initech", "--attempt", MISSING, "--to", "Stopped",
                  "--evidence", "x", "--by", "alice"], EXIT_BAD_INPUT, id="reconcile-to-a-non-outcome"),
    pytest.param(["correct", MISSING, "--tenant", "Initech", "--attempt", MISSING, "--from", "Completed", "--to",
                  "Failed", "--evidence-ref", "x", "--why", "y", "--by", "alice"], EXIT_BAD_INPUT,
                 id="correct-to-failed-without-a-reason"),
    pytest.param(["destination", "add", "--no-check",
                  "--tenant", "Initech", "--name", "p", "--host", "h", "--username", "u",
                  "--remote-dir", "/", "--credential-ref", "hunter2", "--host-key", "h ssh-ed25519 AAAA"],
                 EXIT_BAD_INPUT, id="a-secret-as-credential-ref"),
])
def test_bad_input_is_one_line_on_stderr_with_its_exit_code_and_changes_nothing(exports_cli, admin, seed, tenant,
                                                                                 argv, code, queued):
    queued()
    before = snapshot(admin)
    result = exports_cli(*argv, expect=code)
    one_line_error(result)
    assert "hunter2" not in result.stderr
    assert snapshot(admin) == before
    assert result.code != EXIT_OK


def test_with_json_an_error_is_one_json_object_on_stderr_and_nothing_on_stdout(exports_cli, tenant):
    missing = str(uuid.uuid4())
    result = exports_cli("cancel", missing, "--tenant", "Initech", "--by", "alice", "--json", expect=EXIT_NOT_FOUND)
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1 and result.stdout == ""
    body = json.loads(result.stderr)
    assert body["exit_code"] == EXIT_NOT_FOUND and body["reply"] == "NotFound"
    assert uuid.UUID(body["request_id"])


def test_an_unreachable_database_is_a_one_line_error_not_a_traceback(tmp_path):
    cli = ExportsCli(clean_environ(EXPORTS_DATABASE_URL="postgresql://exports@127.0.0.1:1/exports",
                                   EXPORTS_STATE_DIR=str(tmp_path)))
    one_line_error(cli("list", expect=EXIT_FAILURE))
