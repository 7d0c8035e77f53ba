"""``exports destination pause|drain|resume`` and ``exports tenant list|pause|resume``, run as the real
console script: each answers what it changed (and ``--json``), a second run changes nothing, ``status`` and
``show`` tell who paused and why, and bad input is one line with its exit code and no write."""

from __future__ import annotations

import json

import pytest

from app.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_REFUSED
from app.store import export
from app.store.types import FailureCause, FailureCode
from tests.acceptance.test_cli import Tenant, grant, one_line_error, snapshot

PAUSE = ("destination", "pause", "partner", "--tenant", "Initech", "--by", "ops-alice", "--reason", "partner upgrade")


#: A key ``destination show`` can parse (the seeder's placeholder is not one).
HOST_KEY = "[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.fixture
def tenant(seed, admin) -> Tenant:
    """Tenant 'Initech' with one destination, 'partner'."""
    tenant_id = seed.tenant("Initech")
    destination_id = seed.destination(tenant_id)
    admin.execute("UPDATE destinations SET host_key = %s WHERE id = %s", (HOST_KEY, destination_id))
    return Tenant(tenant_id, destination_id)


def _directory_events(admin) -> list[tuple[str, str]]:
    return [(r["kind"], r["changed_by"]) for r in
            admin.execute("SELECT kind, changed_by FROM directory_events ORDER BY id").fetchall()]


def test_destination_pause_holds_its_exports_status_and_show_say_who_and_why_and_resume_wakes_them(
        exports_cli, admin, seed, tenant):
    job = seed.queued(tenant.id, tenant.destination_id)

    paused = exports_cli(*PAUSE)
    again = exports_cli(*PAUSE, "--json").json

    assert "destination 'partner' paused: 1 queued exports wait" in paused.stdout
    assert (again["changed"], again["state"], again["paused_by"], again["reason"]) == (
        False, "paused", "ops-alice", "partner upgrade")
    status = exports_cli("destination", "status", "--json").json
    assert [(s["pause_state"], s["paused_by"], s["paused_reason"], s["held_jobs"]) for s in status] == [
        ("paused", "ops-alice", "partner upgrade", 1)]
    assert "paused by ops-alice: partner upgrade" in exports_cli("destination", "status").stdout
    shown = exports_cli("destination", "show", "--tenant", "Initech", "--destination", "partner", "--json").json
    assert (shown["pause_state"], shown["paused_by"], shown["queued"]) == ("paused", "ops-alice", 1)
    assert "paused by ops-alice since" in exports_cli("destination", "show", "--tenant", "Initech",
                                                      "--destination", "partner").stdout
    wake_ups = len(seed.outbox(job))

    resumed = exports_cli("destination", "resume", "--tenant", "Initech", "--destination", "partner", "--json").json

    assert (resumed["changed"], resumed["woken"], resumed["state"]) == (True, 1, "active")
    assert len(seed.outbox(job)) == wake_ups + 1
    assert "is not paused; nothing changed" in exports_cli("destination", "resume", "partner",
                                                           "--tenant", "Initech").stdout
    assert [kind for kind, _ in _directory_events(admin)] == ["Paused", "Resumed"]


def test_destination_drain_pauses_at_once_when_nothing_runs(exports_cli, tenant):
    drained = exports_cli("destination", "drain", "partner", "--tenant", "Initech", "--json").json
    assert (drained["changed"], drained["state"]) == (True, "paused")
    assert "is paused already; nothing changed" in exports_cli("destination", "drain", "partner",
                                                               "--tenant", "Initech").stdout


def test_destination_drain_waits_for_a_running_attempt_and_answers_busy_when_the_wait_runs_out(
        exports_cli, admin, seed, tenant):
    seed.running(seed.queued(tenant.id, tenant.destination_id))

    draining = exports_cli("destination", "drain", "partner", "--tenant", "Initech")
    waited = exports_cli("destination", "drain", "partner", "--tenant", "Initech", "--wait", "1", expect=EXIT_REFUSED)
    as_json = exports_cli("destination", "drain", "partner", "--tenant", "Initech", "--wait", "1", "--json",
                          expect=EXIT_REFUSED)

    assert "draining: 1 attempts still running finish" in draining.stdout
    one_line_error(waited)
    assert "still running after 1 s" in waited.stderr
    assert (json.loads(as_json.stderr)["state"], json.loads(as_json.stderr)["running"]) == ("draining", 1)
    assert admin.execute("SELECT pause_state FROM destinations").fetchone()["pause_state"] == "draining"
    assert [kind for kind, _ in _directory_events(admin)] == ["Draining"]


def test_destination_status_shows_the_newest_failed_exports_cause_as_the_last_error(exports_cli, seed, conn, tenant):
    job = seed.running(seed.queued(tenant.id, tenant.destination_id))
    assert export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                    failure_reason=FailureCode.NOT_DELIVERED, cause=FailureCause.CONFIGURATION,
                                    detail="the partner refused the configuration: authentication failed") == 1

    status = exports_cli("destination", "status", "--json").json

    assert status[0]["last_error"] == ("NotDelivered (configuration): the partner refused the configuration: "
                                       "authentication failed")
    assert "NotDelivered (configuration): the partner refused" in exports_cli("destination", "status").stdout


@pytest.mark.parametrize(("args", "code"), [
    (("destination", "pause", "nope", "--tenant", "Initech"), EXIT_NOT_FOUND),
    (("destination", "pause", "partner", "--tenant", "Nobody"), EXIT_NOT_FOUND),
    (("destination", "resume", "partner", "--tenant", "Globex"), EXIT_NOT_FOUND),   # another tenant's
    (("destination", "drain", "partner", "--destination", "partner", "--tenant", "Initech"), EXIT_BAD_INPUT),
    (("destination", "drain", "--tenant", "Initech"), EXIT_BAD_INPUT),
    (("destination", "pause", "partner", "--tenant", "Initech", "--reason", "a\x1b[31mred"), EXIT_BAD_INPUT),
    (("destination", "drain", "partner", "--tenant", "Initech", "--wait", "0"), EXIT_BAD_INPUT),
    (("tenant", "pause", "Nobody"), EXIT_NOT_FOUND),
    (("tenant", "resume", "not-a-tenant\x07"), EXIT_BAD_INPUT),
])
def test_pause_verbs_answer_bad_input_in_one_line_and_write_nothing(exports_cli, admin, seed, tenant, args, code):
    seed.tenant("Globex")
    before = snapshot(admin)

    for json_flag in ((), ("--json",)):
        result = exports_cli(*args, *json_flag, expect=code)
        one_line_error(result) if not json_flag else None
        assert "Traceback" not in result.stderr

    assert snapshot(admin) == before
    assert admin.execute("SELECT count(*) AS n FROM directory_events").fetchone()["n"] == 0


def test_tenant_pause_list_and_resume(exports_cli, admin, seed, tenant):
    seed.queued(tenant.id, tenant.destination_id)
    seed.tenant("Globex")

    paused = exports_cli("tenant", "pause", "Initech", "--by", "ops-alice", "--reason", "contract review")
    listed = exports_cli("tenant", "list", "--json").json
    text = exports_cli("tenant", "list").stdout

    assert "tenant 'Initech' paused: 1 queued exports wait" in paused.stdout and "queue and wait too" in paused.stdout
    assert [(t["name"], t["paused"], t["paused_by"], t["queued"]) for t in listed] == [
        ("Globex", False, None, 0), ("Initech", True, "ops-alice", 1)]
    assert "by ops-alice since" in text and "contract review" in text
    assert exports_cli("tenant", "pause", "Initech", "--json").json["changed"] is False
    status = exports_cli("destination", "status", "--tenant", "Initech", "--json").json
    assert (status[0]["tenant_paused"], status[0]["held_jobs"]) == (True, 1)

    resumed = exports_cli("tenant", "resume", "Initech", "--json").json

    assert (resumed["changed"], resumed["woken"]) == (True, 1)
    assert [kind for kind, _ in _directory_events(admin)] == ["Paused", "Resumed"]


def test_create_for_a_paused_tenant_still_queues_and_says_it_waits(exports_cli, admin, conn, tenant):
    grant(conn, tenant.id, "alice")
    exports_cli("tenant", "pause", "Initech")

    created = exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "alice")
    as_json = exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "alice", "--json").json

    assert "queued for 'partner'" in created.stdout and "its tenant is paused: it waits until resumed" in created.stdout
    assert as_json["held"] == "its tenant is paused"
    assert [r["status"] for r in admin.execute("SELECT status FROM export_jobs").fetchall()] == ["Queued", "Queued"]
    exports_cli("tenant", "resume", "Initech")
    assert exports_cli("create", "--tenant", "Initech", "--destination", "partner", "--by", "alice",
                       "--json").json["held"] is None


def test_exports_show_says_what_holds_a_queued_export_until_the_resume(exports_cli, seed, tenant):
    job = seed.queued(tenant.id, tenant.destination_id)

    def held_by() -> str | None:
        return exports_cli("show", str(job.id), "--tenant", "Initech", "--json").json["held_by"]

    before = held_by()
    exports_cli(*PAUSE)
    by_destination = held_by()
    text = exports_cli("show", str(job.id), "--tenant", "Initech").stdout
    exports_cli("tenant", "pause", "Initech", "--by", "ops-bob")
    by_tenant = held_by()
    exports_cli("tenant", "resume", "Initech", "--by", "ops-bob")
    exports_cli("destination", "resume", "--tenant", "Initech", "--destination", "partner")

    assert before is None and held_by() is None
    assert by_destination.startswith("its destination, paused by ops-alice at ")
    assert "held: it waits for a resume of its destination" in text
    assert by_tenant.startswith("its tenant, paused by ops-bob at ")
