"""A session against real servers: the cipher it negotiates, the size of its write requests, and
pipelined writes that arrive whole, stop at the first write the server refuses, and never wait
longer than the timeout on a server that stops answering."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest

from app.delivery.classifier import Failed, Unknown
from app.delivery.credentials import resolve_credential
from app.delivery.evidence import Evidence, EvidenceStage
from app.delivery.session import CHUNK_SIZE, MAX_WRITE_SIZE, Session, open_session
from app.store.types import ExpectedFile, FailureCause, FailureCode
from tests.fixtures.sftp import SSHD, SftpPeer, require_binary, require_root, running_openssh
from tests.support import unavailable

GCM = "aes128-gcm@openssh.com"


@contextmanager
def session_with(peer: SftpPeer) -> Iterator[Session]:
    config = peer.config
    session = open_session(config, config.pinned_keys(), resolve_credential(config.credential_ref, peer.environ))
    try:
        yield session
    finally:
        session.close()


def _ignore(evidence: Evidence) -> None:
    pass


def _cipher(session: Session) -> str:
    transport = session.client.get_transport()
    assert transport is not None
    return transport.remote_cipher


def _local(tmp_path: Path, size: int) -> Path:
    path = tmp_path / f"local-{size}.csv"
    path.write_bytes(os.urandom(size))
    return path


@pytest.mark.openssh
def test_against_openssh_a_session_negotiates_aes_gcm_and_writes_as_much_per_request_as_its_limits_allow(
        openssh_sftp: SftpPeer) -> None:
    with session_with(openssh_sftp) as session:
        assert _cipher(session) == GCM
        # OpenSSH 9's sftp-server takes 255 KiB writes (limits@openssh.com), which its own client uses too.
        assert session.write_size() == MAX_WRITE_SIZE == 261120


def test_the_embedded_partner_negotiates_aes_gcm_and_not_telling_its_limits_gets_writes_of_32_kib(
        embedded_sftp: SftpPeer) -> None:
    with session_with(embedded_sftp) as session:
        # paramiko's server offers AES-GCM too (after CTR and CBC: the client's order decides).
        assert _cipher(session) == GCM
        assert session.write_size() == CHUNK_SIZE == 32768


@pytest.mark.proftpd
def test_proftpd_negotiates_aes_gcm_and_not_telling_its_limits_gets_writes_of_32_kib(proftpd_sftp: SftpPeer) -> None:
    with session_with(proftpd_sftp) as session:
        assert _cipher(session) == GCM
        assert session.write_size() == CHUNK_SIZE


@pytest.mark.openssh
def test_a_server_offering_no_aes_gcm_still_connects_with_a_cipher_both_know_and_delivers(tmp_path: Path) -> None:
    require_binary(SSHD, "OpenSSH sshd")
    require_root("OpenSSH sshd")
    with running_openssh(tmp_path / "openssh", extra_options="Ciphers aes256-ctr,aes128-ctr\n") as peer:
        data = os.urandom(300_000)
        local = tmp_path / "local.csv"
        local.write_bytes(data)
        expected = ExpectedFile("contacts.csv", len(data), hashlib.sha256(data).digest())

        with session_with(peer) as session:
            # The client's order decides among the ciphers both offer: paramiko's own, CTR first.
            assert _cipher(session) == "aes128-ctr"
        outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=_ignore)

        assert outcome.status == "Completed"
        assert (peer.inbox / "contacts.csv").read_bytes() == data


@pytest.mark.parametrize("peer_fixture", [
    "embedded_sftp",
    pytest.param("openssh_sftp", marks=pytest.mark.openssh),
    pytest.param("proftpd_sftp", marks=pytest.mark.proftpd),
])
def test_files_of_every_size_around_the_write_size_arrive_whole_with_the_size_and_hash_sent(
        peer_fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    peer: SftpPeer = request.getfixturevalue(peer_fixture)
    with session_with(peer) as session:
        step = session.write_size()
        for size in (0, 1, step - 1, step, step + 1, 3 * step + 7, 70 * step + 1):
            local = _local(tmp_path, size)
            remote = peer.config.remote_path(f".upload-{size}.part")

            sent = session.upload(local, remote)

            data = local.read_bytes()
            assert sent == (size, hashlib.sha256(data).digest())
            assert (peer.inbox / f".upload-{size}.part").read_bytes() == data


@pytest.mark.openssh
def test_an_upload_never_replaces_an_existing_file(openssh_sftp: SftpPeer, tmp_path: Path) -> None:
    (openssh_sftp.inbox / ".taken.part").write_bytes(b"someone else's\n")
    with session_with(openssh_sftp) as session, pytest.raises(OSError):
        session.upload(_local(tmp_path, 100_000), openssh_sftp.config.remote_path(".taken.part"))

    assert (openssh_sftp.inbox / ".taken.part").read_bytes() == b"someone else's\n"


@pytest.mark.openssh
def test_a_write_the_server_refuses_ends_the_delivery_with_the_refusal_and_nothing_is_published(
        openssh_sftp: SftpPeer, tmp_path: Path) -> None:
    peer = openssh_sftp
    # Past the tmpfs by less than 100 of paramiko's 32 KiB writes, where its pipelined SFTPFile never
    # reads a reply before close, which drops them unread.
    data = os.urandom(2 * 2**20 + 512 * 1024)
    local = tmp_path / "local.csv"
    local.write_bytes(data)
    expected = ExpectedFile("contacts.csv", len(data), hashlib.sha256(data).digest())

    with _full_after(peer.inbox, 2 * 2**20):
        outcome = peer.destination().deliver(local, expected, attempt_id="att-1", record_evidence=_ignore)
        left = sorted(p.name for p in peer.inbox.iterdir())

    # OpenSSH answers ENOSPC with a bare "Failure" status; the upload stops there, with that refusal.
    assert isinstance(outcome, Failed) and outcome.code is FailureCode.NOT_DELIVERED
    assert "OSError: Failure" in outcome.detail and outcome.cause is FailureCause.PERMANENT
    assert left == []


@pytest.mark.openssh
def test_a_server_that_stops_taking_data_mid_upload_times_out_within_bounds(
        openssh_sftp: SftpPeer, tmp_path: Path, fault_proxy) -> None:
    data = os.urandom(16 * 2**20)   # well past the 2 MiB channel window: the writer waits on the window
    local = tmp_path / "local.csv"
    local.write_bytes(data)
    expected = ExpectedFile("contacts.csv", len(data), hashlib.sha256(data).digest())
    proxy, route = fault_proxy(openssh_sftp.with_config(io_timeout=1.0, connect_timeout=1.0))

    def hold_once_uploading(evidence: Evidence) -> None:
        if evidence.stage is EvidenceStage.BASELINE:
            proxy.hold_after(4 * 2**20)

    started = time.monotonic()
    outcome = route.destination().deliver(local, expected, attempt_id="att-1", record_evidence=hold_once_uploading)
    elapsed = time.monotonic() - started

    assert proxy.held.is_set()
    # The look afterwards goes through the held proxy too, so nothing settles it.
    assert isinstance(outcome, Unknown) and "Timeout" in outcome.detail
    assert elapsed < 10
    assert not (openssh_sftp.inbox / "contacts.csv").exists()


@contextmanager
def _full_after(directory: Path, size: int) -> Iterator[None]:
    """``directory`` on a tmpfs of ``size`` bytes for the block: writes past it fail with ENOSPC."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        unavailable(f"a small tmpfs cannot be mounted here ({mounted.stderr.strip()}); the test runs as root")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_server_with_an_rsa_and_an_ed25519_host_key_presents_whichever_is_pinned(tmp_path: Path) -> None:
    require_binary(SSHD, "OpenSSH sshd")
    require_root("OpenSSH sshd")
    rsa_path = tmp_path / "ssh_host_rsa_key"
    rsa = paramiko.RSAKey.generate(2048)
    rsa.write_private_key_file(str(rsa_path))
    with running_openssh(tmp_path / "openssh", extra_options=f"HostKey {rsa_path}\n") as peer:
        rsa_line = f"[127.0.0.1]:{peer.config.port} ssh-rsa {rsa.get_base64()}"
        only_rsa = peer.with_config(host_key=rsa_line)
        both = peer.with_config(more_host_keys=(rsa_line,))

        for pinned, presented in ((only_rsa, "rsa-sha2-512"), (peer, "ssh-ed25519"), (both, "ssh-ed25519")):
            with session_with(pinned) as session:
                transport = session.client.get_transport()
                assert transport is not None and transport.host_key_type == presented
                assert pinned.config.pinned_keys().accepts(transport.get_remote_server_key())
