"""Partners as they are, through the real system and the real `exports` command: for a server with a quirk
(OpenSSH's sftp-server denying rename or stat, a quick ingestion), `destination check` recommends the
delivery mode, `--apply` records it (and refuses no-rename until the profile writes a completion marker),
`destination show` prints it, and an export is delivered in it by a real worker, cutoff 2 recording the
mode; a server on which no mode can publish without risking a file it did not write (rclone serve sftp)
is reported so, exit 4."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.steps import OPERATOR, TENANT, job_row, set_up, wait_status
from tests.fixtures.partners import BY_ID, Partner
from tests.fixtures.processes import System

CHECK = ("destination", "check", "--tenant", TENANT, "--destination", "partner")
EDIT = ("destination", "edit", "--tenant", TENANT, "--destination", "partner", "--by", OPERATOR)


def _start(system: System, partner: Partner) -> None:
    system.group.env.update(partner.peer.environ)
    set_up(system, partner.peer, contacts=200)


def _deliver(system: System, admin) -> dict:
    system.start_relay()
    system.start_worker()
    job_id = system.cli("create", "--tenant", TENANT, "--destination", "partner", "--by", OPERATOR, "--json").json[
        "job_id"]
    wait_status(system, admin, job_id, "Completed")
    return job_row(admin, job_id)


@pytest.mark.openssh
def test_no_rename_is_recommended_recorded_only_with_a_marker_and_delivered_in_place(
        system: System, admin, tmp_path: Path) -> None:
    with BY_ID["openssh-no-rename"].start(tmp_path / "partner") as partner:
        _start(system, partner)

        checked = system.cli(*CHECK, "--json").json
        without_marker = system.cli(*CHECK, "--apply", expect=4)
        system.cli(*EDIT, "--marker", "done", "--bandwidth-limit", "10MiB")
        applied = system.cli(*CHECK, "--apply", "--json").json
        dropping_marker = system.cli(*EDIT, "--marker", "none", expect=2)
        shown = system.cli("destination", "show", "--tenant", TENANT, "--destination", "partner", "--json").json
        job = _deliver(system, admin)
        files = partner.peer.files()
        back = system.cli(*EDIT, "--delivery-mode", "standard", "--bandwidth-limit", "off", "--json").json

    assert (checked["recommended"], checked["recorded_mode"], checked["applied"]) == ("no-rename", "standard", False)
    assert (back["delivery_mode"], back["bandwidth_limit"], back["profile_version"]) == ("standard", None, 2)
    assert checked["capabilities"]["rename"] is False and checked["modes"]["standard"]["fits"] is False
    assert "completion marker" in without_marker.stderr and "nothing recorded" in without_marker.stderr
    assert (applied["applied"], applied["recorded_mode"], applied["previous_mode"]) == (True, "no-rename", "standard")
    assert "completion marker" in dropping_marker.stderr
    assert (shown["delivery_mode"], shown["bandwidth_limit"]) == ("no-rename", 10 * 1024 * 1024)
    assert job["expected_delivery_mode"] == "no-rename"
    name = job["expected_file_name"]
    assert sorted(files) == sorted([name, f"{name}.done"]) and len(files[name]) == job["expected_file_bytes"]


@pytest.mark.openssh
def test_a_quick_ingestion_is_seen_only_when_asked_for_then_recorded_and_delivered_to(
        system: System, admin, tmp_path: Path) -> None:
    with BY_ID["openssh-quick-ingest"].start(tmp_path / "partner") as partner:
        _start(system, partner)

        not_asked = system.cli(*CHECK, "--json").json
        applied = system.cli(*CHECK, "--probe-ingestion", "5", "--apply").stdout
        job = _deliver(system, admin)
        receipt = admin.execute(
            "SELECT detail FROM export_attempt_events WHERE job_id = %s AND kind = 'Finished'", (job["id"],)
        ).fetchone()["detail"]
        taken = partner.copies(job["expected_file_name"])

    # Without --probe-ingestion nothing visible is published, and the ingestion cannot be seen.
    assert (not_asked["recommended"], not_asked["capabilities"]["ingested"]) == ("standard", None)
    assert "recorded: quick-ingest (was standard)" in applied
    assert job["expected_delivery_mode"] == "quick-ingest" and "Completed" in receipt
    assert len(taken) == 1 and len(taken[0]) == job["expected_file_bytes"]


@pytest.mark.openssh
def test_a_server_denying_stat_is_delivered_to_in_no_stat(system: System, admin, tmp_path: Path) -> None:
    with BY_ID["openssh-no-stat"].start(tmp_path / "partner") as partner:
        _start(system, partner)

        system.cli(*CHECK, "--apply")
        job = _deliver(system, admin)
        files = partner.peer.files()

    assert job["expected_delivery_mode"] == "no-stat"
    assert list(files) == [job["expected_file_name"]]


def test_a_server_that_can_only_overwrite_is_reported_deliverable_in_no_mode(
        system: System, admin, tmp_path: Path) -> None:
    with BY_ID["rclone"].start(tmp_path / "partner") as partner:
        _start(system, partner)

        refused = system.cli(*CHECK, "--apply", "--json", expect=4)
        shown = system.cli("destination", "show", "--tenant", TENANT, "--destination", "partner", "--json").json

    assert "cannot be delivered to in any mode" in refused.stderr
    assert "rename replaces an existing file" in refused.stderr
    assert shown["delivery_mode"] == "standard"
