"""A session against real servers: the cipher it negotiates."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.delivery.credentials import resolve_credential
from app.delivery.evidence import Evidence
from app.delivery.session import Session, open_session
from app.store.types import ExpectedFile
from tests.fixtures.sftp import SSHD, SftpPeer, require_binary, require_root, running_openssh

GCM = "aes128-gcm@openssh.com"


@contextmanager
def session_with(peer: SftpPeer) -> Iterator[Session]:
    config = peer.config
    session = open_session(config, config.pinned_key(), resolve_credential(config.credential_ref, peer.environ))
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


@pytest.mark.openssh
def test_against_openssh_a_session_negotiates_aes_gcm(openssh_sftp: SftpPeer) -> None:
    with session_with(openssh_sftp) as session:
        assert _cipher(session) == GCM


def test_the_embedded_partner_negotiates_aes_gcm(embedded_sftp: SftpPeer) -> None:
    with session_with(embedded_sftp) as session:
        # paramiko's server offers AES-GCM too (after CTR and CBC: the client's order decides).
        assert _cipher(session) == GCM


@pytest.mark.proftpd
def test_proftpd_negotiates_aes_gcm(proftpd_sftp: SftpPeer) -> None:
    with session_with(proftpd_sftp) as session:
        assert _cipher(session) == GCM


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
