"""A tenant's webhooks as an operator sets them up and a receiver sees them: the real ``exports webhook``
commands and the real ``exports notifier`` process, against a real PostgreSQL and a receiver on loopback.
Every bad input answers its exit code in one line on stderr, with nothing written and no secret echoed."""

from __future__ import annotations

import json
import uuid

import pytest

from app.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_UNHEALTHY
from app.store.types import Status
from app.webhooks import signing
from exports_devtools.processes import clean_environ
from exports_devtools.waiting import wait_until
from exports_devtools.webhook_receiver import WebhookReceiver
from tests.fixtures.processes import ExportsCli

SECRET = signing.new_secret()


@pytest.fixture
def cli(db_url, tmp_path) -> ExportsCli:
    return ExportsCli(clean_environ(EXPORTS_DATABASE_URL=db_url, EXPORTS_STATE_DIR=str(tmp_path / "state"),
                                    ACME_HOOK_SECRET=SECRET))


@pytest.fixture
def receiver():
    hook = WebhookReceiver(SECRET).start()
    yield hook
    hook.stop()


@pytest.fixture
def tenant(seed):
    return seed.tenant("Acme")


def endpoints(admin) -> list[dict]:
    return admin.execute("SELECT * FROM webhook_endpoints ORDER BY created_at").fetchall()


def one_line_error(result) -> None:
    assert "Traceback" not in result.stderr, str(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("exports"), str(result)


def add(cli, url: str, *more: str, expect: int = EXIT_OK):
    """``webhook add`` of endpoint 'prod' for Acme; --json when it is expected to succeed."""
    return cli("webhook", "add", "--tenant", "Acme", "--name", "prod", "--url", url,
               "--secret-ref", "env:ACME_HOOK_SECRET", *more, *(("--json",) if expect == EXIT_OK else ()),
               expect=expect)


def test_new_secret_prints_a_standard_webhooks_secret(cli):
    secret = cli("webhook", "new-secret").stdout.strip()

    assert len(signing.decode_secret(secret)) == 32


def test_webhook_add_stores_the_url_and_only_a_reference_to_the_secret(cli, admin, tenant):
    added = add(cli, "https://hooks.acme.example/exports", "--by", "dana").json

    (row,) = endpoints(admin)
    assert (row["id"], row["tenant_id"], row["url"], row["secret_ref"], row["created_by"], row["allow_http"]) == (
        uuid.UUID(added["webhook_id"]), tenant, "https://hooks.acme.example/exports", "env:ACME_HOOK_SECRET", "dana",
        False)
    assert SECRET not in json.dumps({k: str(v) for k, v in row.items()})


@pytest.mark.parametrize("url, flags, why", [
    ("http://hooks.acme.example/exports", (), "must be https"),
    ("http://hooks.acme.example/exports", ("--allow-http",), "loopback receiver only"),
    ("https://user:pa55@hooks.acme.example/exports", (), "must not carry credentials"),
    ("ftp://hooks.acme.example/exports", (), "must be https"),
    ("https://hooks.acme.example:99999/", (), "not a URL"),
])
def test_webhook_add_refuses_a_url_a_notifier_must_not_post_to_and_writes_nothing(cli, admin, tenant, url, flags, why):
    result = add(cli, url, *flags, expect=EXIT_BAD_INPUT)

    one_line_error(result)
    assert why in result.stderr and endpoints(admin) == []


def test_webhook_add_refuses_a_secret_pasted_for_its_reference_without_echoing_it(cli, admin, tenant):
    result = cli("webhook", "add", "--tenant", "Acme", "--name", "prod", "--url", "https://hooks.acme.example/",
                 "--secret-ref", SECRET, expect=EXIT_BAD_INPUT)

    one_line_error(result)
    assert "env:NAME or file:/absolute/path" in result.stderr
    assert SECRET not in result.stderr + result.stdout and endpoints(admin) == []


def test_webhook_add_for_an_unknown_tenant_or_a_taken_name_answers_its_code(cli, admin, tenant):
    add(cli, "https://hooks.acme.example/a")

    taken = add(cli, "https://hooks.acme.example/b", expect=EXIT_REFUSED)
    unknown = cli("webhook", "add", "--tenant", "Nobody", "--name", "x", "--url", "https://h.example/",
                  "--secret-ref", "env:X", expect=EXIT_NOT_FOUND)

    one_line_error(taken)
    one_line_error(unknown)
    assert "already has a webhook named 'prod'" in taken.stderr
    assert [r["url"] for r in endpoints(admin)] == ["https://hooks.acme.example/a"]


def test_webhook_test_posts_a_signed_request_the_receiver_verifies_and_records_nothing(cli, admin, tenant, receiver):
    add(cli, receiver.url, "--allow-http")

    answered = cli("webhook", "test", "--tenant", "Acme", "--webhook", "prod", "--json").json

    (request,) = receiver.received()
    assert request.verified and answered["delivered"] and answered["http_status"] == 204
    assert request.event_id == answered["event_id"]
    assert json.loads(request.body)["type"] == "webhook.test"
    assert admin.execute("SELECT count(*) AS n FROM webhook_deliveries").fetchone()["n"] == 0


def test_webhook_test_to_a_receiver_that_is_down_is_refused_in_one_line(cli, tenant, receiver):
    add(cli, receiver.url, "--allow-http")
    receiver.stop()

    result = cli("webhook", "test", "--tenant", "Acme", "--webhook", "prod", expect=EXIT_REFUSED)

    one_line_error(result)
    assert "did not take the test request: the connection was refused or failed" in result.stderr


def test_webhook_test_without_the_secret_in_this_shell_says_which_variable_and_sends_nothing(db_url, tmp_path, cli,
                                                                                          tenant, receiver):
    add(cli, receiver.url, "--allow-http")
    bare = ExportsCli(clean_environ(EXPORTS_DATABASE_URL=db_url, EXPORTS_STATE_DIR=str(tmp_path / "state")))

    result = bare("webhook", "test", "--tenant", "Acme", "--webhook", "prod", expect=EXIT_REFUSED)

    one_line_error(result)
    assert "environment variable ACME_HOOK_SECRET is not set" in result.stderr and receiver.received() == []


def test_webhook_remove_then_show_or_remove_again_answers_not_found(cli, admin, tenant):
    add(cli, "https://hooks.acme.example/a")

    cli("webhook", "remove", "--tenant", "Acme", "--webhook", "prod", "--by", "dana")
    again = cli("webhook", "remove", "--tenant", "Acme", "--webhook", "prod", expect=EXIT_NOT_FOUND)
    shown = cli("webhook", "show", "--tenant", "Acme", "--webhook", "prod", expect=EXIT_NOT_FOUND)

    one_line_error(again)
    one_line_error(shown)
    assert [(r["removed_by"], r["removed_at"] is not None) for r in endpoints(admin)] == [("dana", True)]
    assert cli("webhook", "list", "--json").json == []


def test_the_notifier_process_sends_each_outcome_and_list_and_show_account_for_it(cli, process_group, admin, seed,
                                                                                 tenant, receiver):
    add(cli, receiver.url, "--allow-http")
    done = seed.finished(Status.COMPLETED, seed.queued(tenant))
    receiver.stop()
    failing = seed.finished(Status.OUTCOME_UNKNOWN, seed.queued(tenant))
    group = process_group({**cli.env, "EXPORTS_NOTIFIER_METRICS": "off", "EXPORTS_WEBHOOK_POLL_SECONDS": "0.1",
                           "EXPORTS_WEBHOOK_BACKOFF_BASE_SECONDS": "0.2", "EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS": "0.5"})
    group.start("notifier", "notifier")

    def attempts() -> int:
        return admin.execute("SELECT count(*) AS n FROM webhook_attempts").fetchone()["n"]

    wait_until(lambda: attempts() >= 2, "the notifier to try the endpoint's first event twice while it is down", 60)
    shown = cli("webhook", "show", "--tenant", "Acme", "--webhook", "prod", "--json").json
    receiver.start()
    wait_until(lambda: receiver.delivered() >= {d["event_id"] for d in shown["deliveries"]},
               "both events to reach the receiver once it is up", 60)
    (notifier,) = group.stop_all()   # SIGTERM

    assert notifier.problem() is None and notifier.code == 0, notifier.log()[-2000:]
    assert shown["pending"] == 2 and {d["export_id"] for d in shown["deliveries"]} == {str(done.id), str(failing.id)}
    # The endpoint's turn: its first event is the one retried while it is down; the second waits behind it.
    by_export = {d["export_id"]: d["last_result"] for d in shown["deliveries"]}
    assert by_export == {str(done.id): "the connection was refused or failed", str(failing.id): None}
    statuses = {json.loads(r.body)["data"]["export_id"]: json.loads(r.body)["data"]["status"]
                for r in receiver.received() if r.verified}
    assert statuses == {str(done.id): "Completed", str(failing.id): "OutcomeUnknown"}
    listed = cli("webhook", "list", "--tenant", "Acme", "--json").json
    assert [(w["name"], w["pending"], w["dead"], w["last_result"]) for w in listed] == [("prod", 0, 0, "HTTP 204")]


def test_health_fails_its_webhooks_check_while_an_endpoint_is_owed_an_event_past_the_limit(cli, admin, seed, tenant):
    add(cli, "https://hooks.acme.example/a")
    seed.finished(Status.COMPLETED, seed.queued(tenant))
    admin.execute("SET session_replication_role = replica")
    admin.execute("UPDATE webhook_deliveries SET occurred_at = occurred_at - interval '1 hour'")
    admin.execute("SET session_replication_role = origin")

    result = cli("health", "--json", expect=EXIT_UNHEALTHY)

    check = next(c for c in result.json["checks"] if c["name"] == "webhooks")
    assert not check["ok"] and "late: Acme/prod" in check["detail"]


def test_webhook_redeliver_sends_again_what_was_given_up_once_and_dry_run_changes_nothing(cli, admin, seed, tenant):
    add(cli, "https://hooks.acme.example/a")
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))
    admin.execute("UPDATE webhook_deliveries SET state = 'dead', finished_at = clock_timestamp()")
    (event,) = admin.execute("SELECT id FROM webhook_deliveries").fetchall()
    redeliver = ("webhook", "redeliver", "--tenant", "Acme", "--webhook", "prod", "--by", "dana", "--json")

    planned = cli(*redeliver, "--dry-run").json
    assert admin.execute("SELECT state FROM webhook_deliveries").fetchone()["state"] == "dead"
    done = cli(*redeliver).json
    again = cli(*redeliver).json

    assert [(e["event_id"], e["export_id"]) for e in planned["events"]] == [(str(event["id"]), str(job.id))]
    assert (planned["count"], planned["dry_run"], done["count"], again["count"]) == (1, True, 1, 0)
    row = admin.execute("SELECT state, finished_at, revived_by, revived_at FROM webhook_deliveries").fetchone()
    assert (row["state"], row["finished_at"], row["revived_by"]) == ("pending", None, "dana") and row["revived_at"]
    assert cli("webhook", "list", "--tenant", "Acme", "--json").json[0]["dead"] == 0


def test_webhook_redeliver_answers_bad_input_and_unknown_webhooks_in_one_line_writing_nothing(cli, admin, tenant):
    add(cli, "https://hooks.acme.example/a")

    bad = cli("webhook", "redeliver", "--tenant", "Acme", "--webhook", "prod", "--since", "yesterday'; --",
              expect=EXIT_BAD_INPUT)
    unknown = cli("webhook", "redeliver", "--tenant", "Acme", "--webhook", "nope", expect=EXIT_NOT_FOUND)

    one_line_error(bad)
    one_line_error(unknown)
    assert "--since" in bad.stderr


def test_exports_show_lists_the_outcomes_told_to_the_tenant_s_webhooks(cli, admin, seed, tenant):
    add(cli, "https://hooks.acme.example/a")
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))
    quiet = seed.finished(Status.COMPLETED, seed.queued(seed.tenant("Globex")))

    shown = cli("show", str(job.id), "--tenant", "Acme", "--json").json
    text = cli("show", str(job.id), "--tenant", "Acme").stdout
    other = cli("show", str(quiet.id), "--tenant", "Globex", "--json").json

    (event,) = admin.execute("SELECT id FROM webhook_deliveries").fetchall()
    assert [(w["event_id"], w["endpoint_name"], w["status"], w["state"], w["attempts"]) for w in shown["webhooks"]] \
        == [(str(event["id"]), "prod", "Completed", "pending", 0)]
    assert "webhooks" in text and str(event["id"]) in text
    assert other["webhooks"] == []
