"""The demo's partner: the embedded SFTP server (``python -m exports_devtools.sftp_server``) as a subprocess
on 127.0.0.1, with a persistent host key, authorizing a key pair made for the exporter, its files under
the state directory."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from app.config import Settings
from exports_devtools.processes import stop_process

#: Seconds to wait for the partner server to print its host key line.
START_TIMEOUT = 15.0
USERNAME = "partner"


@dataclass(frozen=True)
class Partner:
    """The partner's SFTP server subprocess and what a destination needs to reach it."""

    process: subprocess.Popen
    host: str
    port: int
    #: ``[127.0.0.1]:port ssh-ed25519 AAAA...``, to pin.
    host_key: str
    #: The directory the partner sees as ``/``.
    root: Path
    #: The client's private key file, referenced by the destination as ``keyfile:...``.
    client_key: Path
    username: str = USERNAME

    @property
    def credential_ref(self) -> str:
        return f"keyfile:{self.client_key}"

    def stop(self) -> None:
        stop_process(self.process)


def partner_root(settings: Settings) -> Path:
    return settings.state_dir / "partner" / "root"


def client_key(directory: Path) -> tuple[Path, Path]:
    """An ed25519 key pair for the exporter (private key, public key file), made once."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = directory / "id_ed25519", directory / "id_ed25519.pub"
    if private.exists() and public.exists():
        return private, public
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b" exports\n")
    return private, public


def start_partner(settings: Settings, *, port: int = 0, log_file: Path | None = None) -> Partner:
    """Starts the server, authorizing the exporter's key; returns once it has printed its host key line."""
    base = settings.state_dir / "partner"
    root, keys = partner_root(settings), base / "keys"
    root.mkdir(parents=True, exist_ok=True)
    private, public = client_key(keys)
    log_path = log_file or base / "sftp.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "exports_devtools.sftp_server", "--root", str(root), "--port", str(port),
             "--key-dir", str(base / "host-keys"), "--username", USERNAME, "--authorized-key", str(public)],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    line = _first_line(process, START_TIMEOUT)
    if not line:
        stop_process(process)
        raise RuntimeError(f"the partner SFTP server did not start (see {log_path})")
    name = line.split()[0]
    port_number = int(name.rsplit(":", 1)[1]) if name.startswith("[") else 22
    return Partner(process, "127.0.0.1", port_number, line, root, private)


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    """The first line the process prints, or "" when it prints none within ``timeout`` seconds."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffer = b""
    try:
        while b"\n" not in buffer and selector.select(timeout=max(0.0, deadline - time.monotonic())):
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                break
            buffer += chunk
    finally:
        selector.close()
    return buffer.split(b"\n", 1)[0].decode().strip()
