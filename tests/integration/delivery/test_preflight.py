"""``exports destination check``'s probes against real servers: what each allows, asserted against what its
configuration allows or denies, every scratch file removed again."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.delivery.modes import DeliveryMode
from tests.fixtures.sftp import SSHD, SftpPeer, require_binary, require_root, running_openssh

#: What OpenSSH's internal-sftp, ProFTPD's mod_sftp and the embedded server allow as the tests configure
#: them: everything a delivery needs; posix-rename on OpenSSH, check-file-name on ProFTPD only (the
#: embedded server offers it only when started with --remote-hash).
EXPECTED = {
    "openssh_sftp": dict(posix_rename=True, check_file_sha256=False),
    "proftpd_sftp": dict(check_file_sha256=True),
    "embedded_sftp": dict(check_file_sha256=False),
}


@pytest.mark.parametrize("peer_fixture", [
    "embedded_sftp",
    pytest.param("openssh_sftp", marks=pytest.mark.openssh),
    pytest.param("proftpd_sftp", marks=pytest.mark.proftpd),
])
def test_a_server_configured_as_the_tests_do_allows_what_a_delivery_needs_and_keeps_no_scratch_file(
        request: pytest.FixtureRequest, peer_fixture: str) -> None:
    peer: SftpPeer = request.getfixturevalue(peer_fixture)

    found = peer.destination().check()

    assert found.deliverable, found.why
    assert all(found.found[name] is True for name in ("write", "stat", "lstat", "list", "rename",
                                                      "rename_refuses_overwrite"))
    for name, value in EXPECTED[peer_fixture].items():
        assert found.found[name] is value, (name, found.why)
    assert peer.files() == {}


def test_a_server_that_denies_rename_is_found_deliverable_only_in_place_and_says_why(tmp_path: Path) -> None:
    require_binary(SSHD, "OpenSSH sshd")
    require_root("OpenSSH sshd")
    # A Match block overrides the ForceCommand before it: OpenSSH's own request filter denies renames.
    deny = "Match all\n    ForceCommand internal-sftp -P rename,posix-rename,setstat,fsetstat\n"
    with running_openssh(tmp_path / "openssh", extra_options=deny) as peer:
        found = peer.destination().check()

        assert (found.found["write"], found.found["rename"], found.found["setstat"]) == (True, False, False)
        assert found.found["rename_refuses_overwrite"] is None and found.found["exclusive_create"] is True
        assert found.recommended is DeliveryMode.NO_RENAME and found.deliverable
        assert found.missing(DeliveryMode.STANDARD) == ["rename", "rename_refuses_overwrite"]
        assert "refuses rename" in found.verdict
        assert peer.files() == {}
