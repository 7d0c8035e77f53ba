"""An embedded partner SFTP server for the demo and the tests, on paramiko's server API.

Loopback only, a generated ed25519 host key persisted in a directory, password and/or public key
authentication for one user. What a session sees (the chroot, OpenSSH's rename, ProFTPD's
check-file-name, acknowledgment files) and the fault hooks (``server.faults``) are in
``exports_devtools.sftp_subsystem``; ``remote_hash``, ``acknowledgments`` and ``faults`` can be switched
on a running server.

Run ``python -m exports_devtools.sftp_server --root DIR --port N --username U --password-env VAR`` for the demo.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from exports_devtools.sftp_faults import Faults
from exports_devtools.sftp_subsystem import Subsystem

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
HOST_KEY_FILE = "ssh_host_ed25519_key"
#: Seconds stop() waits for each connection thread.
STOP_JOIN_TIMEOUT = 5.0


@dataclass(frozen=True)
class ServerAddress:
    host: str
    port: int
    #: The line a client pins: ``[host]:port ssh-ed25519 AAAA...``.
    known_hosts_line: str


def load_or_create_host_key(key_dir: Path) -> paramiko.Ed25519Key:
    """The server's ed25519 host key, generated once and kept so the pinned line stays valid."""
    key_dir.mkdir(parents=True, exist_ok=True)
    path = key_dir / HOST_KEY_FILE
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
    return paramiko.Ed25519Key(filename=str(path))


class _Auth(paramiko.ServerInterface):
    def __init__(self, embedded: EmbeddedSftpServer) -> None:
        self.embedded = embedded

    def get_allowed_auths(self, username: str) -> str:
        methods = []
        if self.embedded.authorized_keys:
            methods.append("publickey")
        if self.embedded._password is not None:
            methods.append("password")
        return ",".join(methods)

    def check_auth_password(self, username: str, password: str) -> int:
        expected = self.embedded._password
        if (
            expected is not None
            and username == self.embedded.username
            and hmac.compare_digest(password.encode(), expected.encode())
        ):
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if username == self.embedded.username and any(
            key.get_name() == allowed.get_name() and key.asbytes() == allowed.asbytes()
            for allowed in self.embedded.authorized_keys
        ):
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED


class EmbeddedSftpServer:
    """A loopback SFTP server in background threads. ``start()`` then ``stop()``, or use ``with``."""

    def __init__(
        self,
        *,
        root: Path,
        key_dir: Path,
        username: str,
        password: str | None = None,
        authorized_keys: Sequence[paramiko.PKey] = (),
        remote_hash: bool = False,
        acknowledgments: bool = False,
        port: int = 0,
    ) -> None:
        if password is None and not authorized_keys:
            raise ValueError("configure a password or at least one authorized key")
        self.root = Path(root)
        self.key_dir = Path(key_dir)
        self.username = username
        self._password = password
        self.authorized_keys = tuple(authorized_keys)
        self.remote_hash = remote_hash
        self.acknowledgments = acknowledgments
        self.port = port
        self.faults = Faults()
        #: Called with the real path of every file a rename just put in place (a journal, for the chaos soak).
        self.on_rename: Callable[[str], None] | None = None
        self._host_key: paramiko.PKey | None = None
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._transports: list[paramiko.Transport] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.address: ServerAddress | None = None

    def __repr__(self) -> str:
        return f"EmbeddedSftpServer(root={str(self.root)!r}, port={self.port}, username={self.username!r})"

    def __enter__(self) -> EmbeddedSftpServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ServerAddress:
        self.root.mkdir(parents=True, exist_ok=True)
        self._host_key = load_or_create_host_key(self.key_dir)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, self.port))
        listener.listen(16)
        # A timeout rather than relying on close() to wake a blocked accept(), which Linux does not do.
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        name = f"[{LOOPBACK}]:{self.port}"
        self.address = ServerAddress(
            LOOPBACK, self.port, f"{name} {self._host_key.get_name()} {self._host_key.get_base64()}"
        )
        accept = threading.Thread(target=self._accept_loop, name=f"sftp-accept-{self.port}", daemon=True)
        accept.start()
        self._threads.append(accept)
        log.info("sftp_server.started port=%s root=%s", self.port, self.root)
        return self.address

    def stop(self) -> None:
        self._stopping.set()
        self.faults.release.set()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        with self._lock:
            transports, threads = list(self._transports), list(self._threads)
        for transport in transports:
            transport.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(STOP_JOIN_TIMEOUT)
        log.info("sftp_server.stopped port=%s", self.port)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            worker = threading.Thread(target=self._serve, args=(conn,), name="sftp-conn", daemon=True)
            with self._lock:
                self._threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        with self._lock:
            self._transports.append(transport)
        if self._stopping.is_set():
            transport.close()
            return
        assert self._host_key is not None
        transport.add_server_key(self._host_key)
        transport.set_subsystem_handler("sftp", Subsystem, self)
        try:
            transport.start_server(server=_Auth(self))
        except (paramiko.SSHException, EOFError, OSError):
            transport.close()
            return
        # Channels are handled by the subsystem handler; accept() just drains the queue.
        while transport.is_active() and not self._stopping.is_set():
            channel = transport.accept(timeout=0.5)
            if channel is None:
                continue


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m exports_devtools.sftp_server", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="directory the client sees as /")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--key-dir", type=Path, help="where the host key is kept (default: ROOT/../host-keys)")
    parser.add_argument("--username", default="partner")
    parser.add_argument(
        "--password-env", help="environment variable holding the password (never the password itself)"
    )
    parser.add_argument("--authorized-key", type=Path, action="append", default=[], help="public key file")
    parser.add_argument("--remote-hash", action="store_true", help="implement check-file-name sha256")
    parser.add_argument("--acknowledgments", action="store_true", help="write <final>.ack after a rename")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    password = os.environ.get(args.password_env) if args.password_env else None
    if args.password_env and not password:
        print(f"environment variable {args.password_env} is not set", file=sys.stderr)
        return 2
    keys = []
    for path in args.authorized_key:
        keytype, data = path.read_text().split()[:2]
        keys.append(paramiko.PKey.from_type_string(keytype, base64.b64decode(data)))
    server = EmbeddedSftpServer(
        root=args.root,
        key_dir=args.key_dir or args.root.parent / "host-keys",
        username=args.username,
        password=password,
        authorized_keys=keys,
        remote_hash=args.remote_hash,
        acknowledgments=args.acknowledgments,
        port=args.port,
    )
    done = threading.Event()
    # Before the line that says it is up: a signal sent as soon as it is read must find the handler.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    address = server.start()
    print(address.known_hosts_line, flush=True)
    # In slices: a signal the kernel hands to another thread does not interrupt a lock wait in this one,
    # and Python runs its handler only when this thread comes back to the interpreter.
    while not done.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
