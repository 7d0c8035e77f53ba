"""``exports list`` by destination and time, a page at a time: the cursor is the last export listed, so
exports created between two pages never shift or repeat a row."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND
from tests.acceptance.test_cli import grant, one_line_error

T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def listed(seed, conn, admin):
    """Initech's exports: five to 'partner' an hour apart from T0, two to 'archive'; and one of Globex's."""
    initech = seed.tenant("Initech")
    partner = seed.destination(initech)
    archive = seed.destination(initech)
    admin.execute("UPDATE destinations SET name = 'archive' WHERE id = %s", (archive,))
    grant(conn, initech, "alice")
    jobs = {"partner": [seed.queued(initech, partner) for _ in range(5)],
            "archive": [seed.queued(initech, archive) for _ in range(2)],
            "globex": [seed.queued()]}
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        for i, job in enumerate(jobs["partner"]):
            admin.execute("UPDATE export_jobs SET created_at = %s WHERE id = %s", (T0 + timedelta(hours=i), job.id))
        for job in (*jobs["archive"], *jobs["globex"]):
            admin.execute("UPDATE export_jobs SET created_at = %s WHERE id = %s", (T0, job.id))
    return {key: [str(j.id) for j in value] for key, value in jobs.items()}


def _ids(result) -> list[str]:
    return [row["job_id"] for row in result.json]


def test_list_by_destination_and_time_keeps_the_exports_created_in_the_window_newest_first(exports_cli, listed):
    found = exports_cli("list", "--tenant", "Initech", "--destination", "partner", "--since", "2026-11-01T09:00",
                        "--until", "2026-11-01T11:00:00+00:00", "--json")

    assert _ids(found) == [listed["partner"][2], listed["partner"][1]]
    everything = _ids(exports_cli("list", "--tenant", "Initech", "--destination", "archive", "--json"))
    assert sorted(everything) == sorted(listed["archive"])


def test_paging_with_the_last_export_listed_visits_each_export_once_even_as_new_ones_arrive(
        exports_cli, seed, listed):
    args = ("list", "--tenant", "Initech", "--destination", "partner", "--limit", "2")
    first = exports_cli(*args)
    assert f"the next one is --after {listed['partner'][3]}" in first.stdout
    seen = _ids(exports_cli(*args, "--json"))
    seed.queued()   # an export created between pages, of another tenant, and newer than all
    while True:
        page = _ids(exports_cli(*args, "--after", seen[-1], "--json"))
        if not page:
            break
        seen += page

    assert seen == list(reversed(listed["partner"]))


@pytest.mark.parametrize("argv, code, said", [
    (("--destination", "partner"), EXIT_BAD_INPUT, "--destination needs --tenant"),
    (("--tenant", "Initech", "--destination", "nowhere"), EXIT_NOT_FOUND, "no destination named 'nowhere'"),
    (("--since", "yesterday"), EXIT_BAD_INPUT, "not an ISO 8601 time"),
    (("--since", "2026-11-02", "--until", "2026-11-01"), EXIT_BAD_INPUT, "--since must be before --until"),
    (("--tenant", "Initech", "--after", str(uuid.UUID(int=7))), EXIT_NOT_FOUND, "no export"),
    (("--after", "not-a-job"), EXIT_BAD_INPUT, "not a UUID"),
])
def test_a_bad_filter_or_cursor_is_one_line_with_its_exit_code(exports_cli, listed, argv, code, said):
    result = exports_cli("list", *argv, expect=code)

    one_line_error(result)
    assert said in result.stderr


def test_another_tenants_export_is_no_cursor_for_a_tenants_listing(exports_cli, listed):
    result = exports_cli("list", "--tenant", "Initech", "--after", listed["globex"][0], "--json", expect=EXIT_NOT_FOUND)

    assert result.stderr.startswith('{"error": "no export ')
