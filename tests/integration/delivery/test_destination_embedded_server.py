"""The embedded partner server behaves like the real peers where delivery depends on it."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from app.delivery.config import DestinationConfig
from app.delivery.destination import Destination
from app.store.types import ExpectedFile
from exports_devtools.sftp_server import EmbeddedSftpServer, load_or_create_host_key
from tests.fixtures.sftp import SftpPeer

BIG = 300_000  # past the 131,072 bytes at which paramiko's own server-side check-file loops for ever


def _sftp(peer: SftpPeer) -> paramiko.SFTPClient:
    client = paramiko.SSHClient()
    keytype, data = peer.config.host_key.split()[1:3]
    pinned = paramiko.PKey.from_type_string(keytype, base64.b64decode(data))
    client.get_host_keys().add(peer.config.known_hosts_name, keytype, pinned)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        peer.config.host,
        port=peer.config.port,
        username=peer.config.username,
        password=peer.environ[next(iter(peer.environ))],
        look_for_keys=False,
        allow_agent=False,
        timeout=5,
    )
    sftp = client.open_sftp()
    sftp.get_channel().settimeout(5)
    return sftp


def test_the_plain_rename_refuses_an_existing_target_with_a_generic_failure(embedded_sftp: SftpPeer) -> None:
    (embedded_sftp.inbox / "a").write_bytes(b"a")
    (embedded_sftp.inbox / "b").write_bytes(b"b")
    sftp = _sftp(embedded_sftp)

    with pytest.raises(OSError) as refused:
        sftp.rename("/inbox/a", "/inbox/b")

    assert refused.value.errno is None and str(refused.value) == "Failure"
    assert (embedded_sftp.inbox / "b").read_bytes() == b"b"


def test_posix_rename_replaces_the_target(embedded_sftp: SftpPeer) -> None:
    (embedded_sftp.inbox / "a").write_bytes(b"a")
    (embedded_sftp.inbox / "b").write_bytes(b"b")

    _sftp(embedded_sftp).posix_rename("/inbox/a", "/inbox/b")

    assert embedded_sftp.files() == {"b": b"a"}


def test_check_file_name_hashes_a_large_file_and_the_old_check_file_is_refused_quickly(
    embedded_sftp: SftpPeer,
) -> None:
    assert embedded_sftp.server is not None
    embedded_sftp.server.remote_hash = True
    data = os.urandom(BIG)
    (embedded_sftp.inbox / "big").write_bytes(data)
    sftp = _sftp(embedded_sftp)

    listing = embedded_sftp.destination(remote_hash=True).inspect("big")
    with sftp.open("/inbox/big", "rb") as handle, pytest.raises(OSError):
        handle.check("sha1")

    assert listing.sha256 == hashlib.sha256(data).digest()


def test_paths_cannot_escape_the_chroot(embedded_sftp: SftpPeer) -> None:
    sftp = _sftp(embedded_sftp)

    assert sorted(sftp.listdir("/../../..")) == ["inbox"]
    with pytest.raises(FileNotFoundError):
        sftp.stat("/../etc/passwd")


def test_the_server_listens_on_loopback_only_and_keeps_its_host_key(tmp_path: Path) -> None:
    with EmbeddedSftpServer(root=tmp_path / "root", key_dir=tmp_path / "keys", username="u", password="p") as server:
        first = server.address
    assert first is not None and first.host == "127.0.0.1"
    assert first.known_hosts_line.startswith(f"[127.0.0.1]:{first.port} ssh-ed25519 ")
    assert load_or_create_host_key(tmp_path / "keys").get_base64() == first.known_hosts_line.split()[2]


def test_a_wrong_password_is_refused(embedded_sftp: SftpPeer, tmp_path: Path) -> None:
    data = b"x" * 10
    (tmp_path / "f").write_bytes(data)
    env = {next(iter(embedded_sftp.environ)): "not-the-password"}

    outcome = Destination(embedded_sftp.config, environ=env).deliver(
        tmp_path / "f",
        ExpectedFile("f.csv", len(data), hashlib.sha256(data).digest()),
        attempt_id="a",
        record_evidence=lambda evidence: None,
    )

    assert outcome.status == "Failed" and "Authentication" in outcome.detail
    assert embedded_sftp.files() == {}


def test_the_command_line_server_accepts_a_delivery_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "DEMO_SFTP_PASSWORD": "demo-pass"}
    (tmp_path / "root" / "inbox").mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "exports_devtools.sftp_server", "--root", str(tmp_path / "root")]
        + ["--password-env", "DEMO_SFTP_PASSWORD"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=Path(__file__).resolve().parents[3],
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        port = int(line.split()[0].rsplit(":", 1)[1])
        config = DestinationConfig(
            host="127.0.0.1",
            port=port,
            username="partner",
            remote_dir="/inbox",
            host_key=line,
            credential_ref="env:DEMO_SFTP_PASSWORD",
            connect_timeout=5,
            io_timeout=5,
        )
        data = os.urandom(1000)
        (tmp_path / "local").write_bytes(data)
        outcome = Destination(config, environ=env).deliver(
            tmp_path / "local",
            ExpectedFile("demo.csv", len(data), hashlib.sha256(data).digest()),
            attempt_id="a",
            record_evidence=lambda evidence: None,
        )
        assert outcome.status == "Completed"
        assert (tmp_path / "root" / "inbox" / "demo.csv").read_bytes() == data
    finally:
        proc.send_signal(signal.SIGTERM)
        # Its stop joins each session thread for up to 5 s: a loaded machine needs more than 10 in all.
        assert proc.wait(timeout=60) == 0
