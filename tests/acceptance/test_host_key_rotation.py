"""A partner that rotates its host key, through the real system to a real OpenSSH server: a destination
pinning only a key the server no longer presents fails its export as a configuration error that names
the key offered; once that key is pinned beside the old one (`destination host-key add`) exports are
delivered, and the old one is unpinned by its fingerprint (`remove`), never the last one; `destination
check` tells the same before any export is tried."""

from __future__ import annotations

import paramiko
import pytest

from app.delivery.hostkeys import fingerprint, parse_host_key
from tests.acceptance.steps import OPERATOR, TENANT, job_row, wait_status
from tests.fixtures.processes import System


@pytest.fixture
def rotating(system: System, openssh_sftp):
    system.group.env.update(openssh_sftp.environ)
    system.cli("tenant", "add", TENANT)
    system.cli("operator", "grant", "--operator", OPERATOR, "--tenant", TENANT)
    system.cli("contacts", "generate", "--tenant", TENANT, "--count", "50", "--seed", "1")
    port = openssh_sftp.config.port
    old = paramiko.RSAKey.generate(2048)   # the key the partner had: the server no longer presents it
    system.cli("destination", "add", "--no-check",
               "--tenant", TENANT, "--name", "partner", "--host", "127.0.0.1", "--port",
               str(port), "--username", openssh_sftp.config.username, "--remote-dir", openssh_sftp.config.remote_dir,
               "--credential-ref", openssh_sftp.config.credential_ref,
               "--host-key", f"[127.0.0.1]:{port} ssh-rsa {old.get_base64()}")
    system.start_relay()
    system.start_worker()
    new_line, new_key = parse_host_key(openssh_sftp.config.host_key, "127.0.0.1", port)
    return system, openssh_sftp, fingerprint(old), new_line, fingerprint(new_key)


def _export(system: System, admin, wanted: str) -> dict:
    created = system.cli("create", "--tenant", TENANT, "--destination", "partner", "--by", OPERATOR, "--json").json
    wait_status(system, admin, created["job_id"], wanted)
    return created


@pytest.mark.openssh
def test_a_rotated_key_fails_naming_the_offered_fingerprint_until_pinned_beside_the_old_one_then_the_old_one_goes(
        rotating, admin):
    system, peer, old, new_line, new = rotating

    refused = _export(system, admin, "Failed")
    failed = admin.execute("SELECT detail FROM export_attempt_events WHERE job_id = %s AND kind = 'Failed'",
                           (refused["job_id"],)).fetchone()["detail"]
    # What the server offered and what to do, within the detail's 300 characters (the pinned list follows).
    assert failed.startswith("NotDelivered (configuration):") and new in failed
    assert "exports destination host-key add" in failed and peer.files() == {}

    checked_before = system.cli("destination", "check", "--tenant", TENANT, "--destination", "partner", expect=4)
    added = system.cli("destination", "host-key", "add", "--tenant", TENANT, "--destination", "partner",
                       "--host-key", new_line, "--json").json
    checked = system.cli("destination", "check", "--tenant", TENANT, "--destination", "partner", "--json").json
    again = system.cli("destination", "host-key", "add", "--tenant", TENANT, "--destination", "partner",
                       "--host-key", new_line, "--json").json
    delivered = _export(system, admin, "Completed")
    shown = system.cli("destination", "show", "--tenant", TENANT, "--destination", "partner", "--json").json

    assert (added["pinned"], added["fingerprint"], again["changed"]) == (2, new, False)
    # `destination check` says the same before any export depends on it.
    assert "cannot be used" in checked_before.stderr and f"{new}, not pinned" in checked_before.stderr
    assert checked["deliverable"] and checked["capabilities"]["rename_refuses_overwrite"] is True
    assert shown["host_key_fingerprints"] == [old, new]
    assert job_row(admin, delivered["job_id"])["expected_file_name"] in peer.files()

    system.cli("destination", "host-key", "remove", "--tenant", TENANT, "--destination", "partner",
               "--fingerprint", old)
    last = system.cli("destination", "host-key", "remove", "--tenant", TENANT, "--destination", "partner",
                      "--fingerprint", new, expect=4)
    unknown = system.cli("destination", "host-key", "remove", "--tenant", TENANT, "--destination", "partner",
                         "--fingerprint", old, expect=3)
    _export(system, admin, "Completed")

    assert system.cli("destination", "show", "--tenant", TENANT, "--destination", "partner",
                      "--json").json["host_key_fingerprints"] == [new]
    assert "only pinned key" in last.stderr and "pins no key" in unknown.stderr
