"""The bulk actions: ``replace --all-not-delivered --since T`` and ``cancel --all-queued``. Each export goes
through the single command's statement under a request id derived from the bulk's, so a retry replays
rather than acts twice; ``--dry-run`` writes nothing; each answer and a summary are printed."""

from __future__ import annotations

import uuid

import pytest

from app.cli.bulk import derived_request_id
from app.cli.common import EXIT_BAD_INPUT, EXIT_BUSY, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED
from app.store.types import FailureCode, Status
from tests.acceptance.test_cli import grant, one_line_error, snapshot
from tests.factories_more import States


@pytest.fixture
def initech(seed, conn):
    tenant_id = seed.tenant("Initech")
    destination_id = seed.destination(tenant_id)
    grant(conn, tenant_id, "alice")
    return tenant_id, destination_id


def _now(admin):
    return admin.execute("SELECT clock_timestamp() AS t").fetchone()["t"].isoformat()


def _replacements(admin) -> list[dict]:
    return admin.execute("SELECT id, replaces_job_id FROM export_jobs WHERE replaces_job_id IS NOT NULL "
                         "ORDER BY created_at").fetchall()


def test_replace_all_not_delivered_replaces_each_original_that_ended_without_a_file_since_the_time_once(
        exports_cli, seed, admin, initech):
    states = States(seed)
    new = lambda: seed.queued(*initech)  # noqa: E731
    before_the_outage = states.failed(FailureCode.BUILD_FAILED, new())
    retried = states.failed(FailureCode.NOT_DELIVERED, new())
    since = _now(admin)
    not_delivered = states.failed(FailureCode.NOT_DELIVERED, new())
    exhausted = states.failed(FailureCode.ATTEMPTS_EXHAUSTED, new())
    states.failed(FailureCode.BUILD_FAILED, states.replacement(retried))   # its replacement failed after T too
    kept = [seed.finished(Status.COMPLETED, new()), states.outcome_unknown_by_worker(new()),
            states.failed(FailureCode.NOT_DELIVERED)]   # delivered, undetermined, and another tenant's
    args = ("replace", "--all-not-delivered", "--since", since, "--tenant", "Initech", "--by", "alice",
            "--reason", "partner outage")
    state = snapshot(admin)

    dry = exports_cli(*args, "--dry-run", "--json").json
    assert snapshot(admin) == state
    expected = {str(j.id) for j in (not_delivered, exhausted, retried)}
    assert {r["original_job_id"] for r in dry["results"]} == expected
    assert dry["summary"] == {"(dry run)": 3}

    request_id = str(uuid.uuid4())
    done = exports_cli(*args, "--request-id", request_id, "--json").json
    assert {r["original_job_id"]: r["reply"] for r in done["results"]} == dict.fromkeys(expected, "Created")
    replaced = _replacements(admin)
    assert {str(r["replaces_job_id"]) for r in replaced} == expected | {str(retried.id)}
    assert str(before_the_outage.id) not in {str(r["replaces_job_id"]) for r in replaced}
    assert all(str(j.id) not in {str(r["replaces_job_id"]) for r in replaced} for j in kept)
    assert len(replaced) == 4   # the three new ones, and the failed replacement made before

    again = exports_cli(*args, "--request-id", request_id, "--json").json
    other = exports_cli(*args, "--json").json   # a new request: every slot is taken now
    assert again["replays"] == 3 and {r["job_id"] for r in again["results"]} == {r["job_id"] for r in done["results"]}
    assert other["summary"] == {"SlotTaken": 3}
    assert len(_replacements(admin)) == 4
    text = exports_cli(*args, "--request-id", request_id).stdout
    assert "3 exports of tenant 'Initech' answered: 3 Created (3 replays)" in text


def test_cancel_all_queued_cancels_each_queued_export_through_the_cancel_statement_once(
        exports_cli, seed, admin, initech):
    queued = [seed.queued(*initech) for _ in range(3)]
    running = seed.running(seed.queued(*initech))
    theirs = seed.queued()
    args = ("cancel", "--all-queued", "--tenant", "Initech", "--by", "alice", "--reason", "tenant offboarded")
    state = snapshot(admin)

    dry = exports_cli(*args, "--dry-run", "--json").json
    assert snapshot(admin) == state and [r["job_id"] for r in dry["results"]] == [str(j.id) for j in queued]

    request_id = uuid.uuid4()
    done = exports_cli(*args, "--request-id", str(request_id), "--json").json
    again = exports_cli(*args, "--request-id", str(request_id), "--json").json

    assert done["summary"] == {"CanceledWhileQueued": 3} and again["results"] == []
    assert [seed.status(j) for j in queued] == [Status.CANCELED] * 3
    assert (seed.status(running), seed.status(theirs)) == (Status.RUNNING, Status.QUEUED)
    recorded = admin.execute("SELECT job_id, id, reason FROM cancellation_requests ORDER BY recorded_at").fetchall()
    assert [(r["job_id"], r["id"], r["reason"]) for r in recorded] == [
        (j.id, derived_request_id(request_id, j.id), "tenant offboarded") for j in queued]


def test_a_bulk_action_for_one_destination_leaves_the_tenants_other_destinations_alone(
        exports_cli, seed, admin, initech):
    tenant_id, partner = initech
    archive = seed.destination(tenant_id)
    admin.execute("UPDATE destinations SET name = 'archive' WHERE id = %s", (archive,))
    states = States(seed)
    since = _now(admin)
    failed = {name: states.failed(FailureCode.NOT_DELIVERED, seed.queued(tenant_id, d))
              for name, d in (("partner", partner), ("archive", archive))}
    queued = {name: seed.queued(tenant_id, d) for name, d in (("partner", partner), ("archive", archive))}

    canceled = exports_cli("cancel", "--all-queued", "--destination", "partner", "--tenant", "Initech",
                           "--by", "alice", "--json").json
    replaced = exports_cli("replace", "--all-not-delivered", "--since", since, "--destination", "partner",
                           "--tenant", "Initech", "--by", "alice", "--reason", "partner outage", "--json").json

    assert [r["original_job_id"] for r in replaced["results"]] == [str(failed["partner"].id)]
    assert [r["job_id"] for r in canceled["results"]] == [str(queued["partner"].id)]
    assert seed.status(queued["archive"]) is Status.QUEUED
    assert [str(r["replaces_job_id"]) for r in _replacements(admin)] == [str(failed["partner"].id)]


def test_a_bulk_cancel_that_meets_a_locked_export_cancels_the_others_and_its_retry_finishes_the_rest(
        exports_cli, seed, admin, initech, connect_as):
    free, locked = seed.queued(*initech), seed.queued(*initech)
    request_id = str(uuid.uuid4())
    args = ("cancel", "--all-queued", "--tenant", "Initech", "--by", "alice", "--request-id", request_id,
            "--lock-timeout", "0.2")
    holder = connect_as(autocommit=False)
    holder.execute("SELECT 1 FROM export_jobs WHERE id = %s FOR UPDATE", (locked.id,))

    first = exports_cli(*args, expect=EXIT_BUSY)
    holder.rollback()
    retry = exports_cli(*args, "--json").json

    assert f"retry with --request-id {request_id}" in first.stdout
    assert (seed.status(free), seed.status(locked)) == (Status.CANCELED, Status.CANCELED)
    assert [r["job_id"] for r in retry["results"]] == [str(locked.id)]


@pytest.mark.parametrize("argv, code, said", [
    (("cancel", "--tenant", "Initech", "--by", "alice"), EXIT_BAD_INPUT, "name an export (JOB) or --all-queued"),
    (("cancel", str(uuid.uuid4()), "--all-queued", "--tenant", "Initech", "--by", "alice"), EXIT_BAD_INPUT,
     "not both"),
    (("cancel", str(uuid.uuid4()), "--dry-run", "--tenant", "Initech", "--by", "alice"), EXIT_BAD_INPUT,
     "--dry-run goes with --all-queued"),
    (("cancel", str(uuid.uuid4()), "--destination", "partner", "--tenant", "Initech", "--by", "alice"),
     EXIT_BAD_INPUT, "--destination goes with --all-queued"),
    (("cancel", "--all-queued", "--destination", "nowhere", "--tenant", "Initech", "--by", "alice"),
     EXIT_NOT_FOUND, "no destination named 'nowhere'"),
    (("replace", "--all-not-delivered", "--tenant", "Initech", "--by", "alice", "--reason", "r"), EXIT_BAD_INPUT,
     "needs --since"),
    (("replace", "--all-not-delivered", "--since", "soon", "--tenant", "Initech", "--by", "alice", "--reason", "r"),
     EXIT_BAD_INPUT, "not an ISO 8601 time"),
    (("cancel", "--all-queued", "--tenant", "Initech", "--by", "mallory"), EXIT_REFUSED, "not allowed"),
    (("replace", "--all-not-delivered", "--since", "2026-01-01", "--tenant", "Globex", "--by", "alice",
      "--reason", "r"), EXIT_NOT_FOUND, "no tenant named 'Globex'"),
])
def test_a_bad_bulk_request_is_one_line_and_changes_nothing(exports_cli, seed, admin, initech, argv, code, said):
    seed.queued(*initech)
    before = snapshot(admin)

    result = exports_cli(*argv, expect=code)

    one_line_error(result)
    assert said in result.stderr and snapshot(admin) == before


def test_a_bulk_action_with_nothing_to_do_says_so_and_exits_zero(exports_cli, initech):
    result = exports_cli("cancel", "--all-queued", "--tenant", "Initech", "--by", "alice", expect=EXIT_OK)

    assert result.stdout.startswith("0 exports of tenant 'Initech' answered: none")
