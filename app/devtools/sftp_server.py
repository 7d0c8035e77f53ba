"""An embedded partner SFTP server for the demo and the tests, on paramiko's server API.

It behaves like the partners we meet, where it matters to delivery:
- loopback only, a generated ed25519 host key persisted in a directory, password and/or public key
  authentication for one user, every path chrooted to a root directory;
- OpenSSH rename semantics: SSH_FXP_RENAME refuses an existing target with the generic "Failure"
  (it is link() then unlink(), as in OpenSSH's sftp-server), ``posix-rename@openssh.com`` replaces;
- optionally ProFTPD's ``check-file-name`` sha256 extension, implemented here: paramiko's own
  server-side check-file loops for ever on files over 131,072 bytes, and ProFTPD rejects that name
  anyway, so the handle-based ``check-file`` is reported unsupported;
- optionally the partner's acknowledgment: after a successful rename, ``<final>.ack`` holding the
  sha256 hex of the file.

Fault hooks (``server.faults``) let tests place an interruption exactly: cut the connection after N
bytes of writes, drop the reply to a rename after performing it, create a file under the rename's
target just before the rename, or hang a request until the server stops. Each fires once and sets
an event, so tests wait on events rather than sleeping.

Run ``python -m app.devtools.sftp_server --root DIR --port N --username U --password-env VAR`` for the demo.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paramiko.message import Message
from paramiko.sftp import (
    CMD_EXTENDED,
    CMD_EXTENDED_REPLY,
    CMD_RENAME,
    CMD_WRITE,
    SFTP_FAILURE,
    SFTP_NO_SUCH_FILE,
    SFTP_OK,
    SFTP_OP_UNSUPPORTED,
    SFTP_PERMISSION_DENIED,
)

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
HOST_KEY_FILE = "ssh_host_ed25519_key"
ACK_SUFFIX = ".ack"
#: Seconds stop() waits for each connection thread.
STOP_JOIN_TIMEOUT = 5.0
#: Bytes read at a time when hashing a file for check-file-name or an acknowledgment.
HASH_CHUNK = 1 << 20


@dataclass
class Faults:
    """One-shot fault injection. Set a field, run the client, wait on the matching event.

    Mutated from the test thread and read from connection threads under ``lock``.
    """

    #: Close the connection when a session's written bytes would pass this many.
    cut_after_write_bytes: int | None = None
    #: Perform the next rename, then close the connection without replying.
    drop_rename_reply: bool = False
    #: Write these bytes under the next rename's target just before performing it.
    occupy_before_rename: bytes | None = None
    #: Request kinds ("rename", "write", "stat", "open") whose next occurrence hangs until stop().
    hang_on: frozenset[str] = frozenset()
    #: Request kinds whose next occurrence waits until ``resume`` is set, then proceeds normally: a
    #: slow peer, for uploads that must outlast a lease.
    hold_on: frozenset[str] = frozenset()
    cut: threading.Event = field(default_factory=threading.Event)
    rename_reply_dropped: threading.Event = field(default_factory=threading.Event)
    occupied: threading.Event = field(default_factory=threading.Event)
    hanging: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, kind: str) -> None:
        with self.lock:
            if kind not in self.hold_on:
                return
            self.hold_on = self.hold_on - {kind}
        self.held.set()
        self.resume.wait()

    def take_hang(self, kind: str) -> bool:
        with self.lock:
            if kind not in self.hang_on:
                return False
            self.hang_on = self.hang_on - {kind}
        self.hanging.set()
        return True


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


def sha256_file(path: str | os.PathLike[str], offset: int = 0, length: int = 0) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        source.seek(offset)
        remaining = length if length > 0 else None
        while remaining is None or remaining > 0:
            chunk = source.read(HASH_CHUNK if remaining is None else min(HASH_CHUNK, remaining))
            if not chunk:
                break
            digest.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return digest.digest()


class _Handle(paramiko.SFTPHandle):
    def stat(self):
        # fstat: paramiko's prefetch (a read-back) asks for the size through the handle.
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)


class _Filesystem(paramiko.SFTPServerInterface):
    """The chrooted filesystem one SFTP session sees."""

    def __init__(self, server: paramiko.ServerInterface, embedded: EmbeddedSftpServer) -> None:
        super().__init__(server)
        self.embedded = embedded
        self.root = os.path.realpath(embedded.root)

    def real(self, path: str | bytes) -> str:
        if isinstance(path, bytes):
            path = path.decode("utf-8")
        virtual = os.path.normpath("/" + path).lstrip("/")
        real = os.path.realpath(os.path.join(self.root, virtual))
        if os.path.commonpath([self.root, real]) != self.root:
            raise PermissionError("outside the chroot")
        return real

    def canonicalize(self, path: str) -> str:
        return os.path.normpath("/" + (path.decode() if isinstance(path, bytes) else path)).replace("//", "/")

    def _attrs(self, real: str, follow: bool = True) -> paramiko.SFTPAttributes:
        st = os.stat(real) if follow else os.lstat(real)
        return paramiko.SFTPAttributes.from_stat(st, os.path.basename(real))

    def list_folder(self, path):
        try:
            real = self.real(path)
            return [self._attrs(os.path.join(real, name), follow=False) for name in sorted(os.listdir(real))]
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def stat(self, path):
        if self.embedded.faults.take_hang("stat"):
            self.embedded.hang()
        try:
            return self._attrs(self.real(path))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def lstat(self, path):
        try:
            return self._attrs(self.real(path), follow=False)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def open(self, path, flags, attr):
        if self.embedded.faults.take_hang("open"):
            self.embedded.hang()
        try:
            real = self.real(path)
            fd = os.open(real, flags, 0o644)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        if flags & os.O_WRONLY:
            mode = "ab" if flags & os.O_APPEND else "wb"
        elif flags & os.O_RDWR:
            mode = "a+b" if flags & os.O_APPEND else "r+b"
        else:
            mode = "rb"
        handle = _Handle(flags)
        handle.filename = real
        handle.readfile = handle.writefile = os.fdopen(fd, mode)
        return handle

    def remove(self, path):
        try:
            os.remove(self.real(path))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        return SFTP_OK

    def rename(self, oldpath, newpath):
        # OpenSSH's sftp-server: link() then unlink(), so an existing target is refused, not replaced.
        try:
            old, new = self.real(oldpath), self.real(newpath)
            if os.path.isdir(old):
                if os.path.lexists(new):
                    return SFTP_FAILURE
                os.rename(old, new)
            else:
                os.link(old, new)
                os.unlink(old)
        except FileExistsError:
            return SFTP_FAILURE
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        self.embedded.acknowledge(new)
        return SFTP_OK

    def posix_rename(self, oldpath, newpath):
        try:
            new = self.real(newpath)
            os.rename(self.real(oldpath), new)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        self.embedded.acknowledge(new)
        return SFTP_OK

    def mkdir(self, path, attr):
        try:
            os.mkdir(self.real(path))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        return SFTP_OK

    def rmdir(self, path):
        try:
            os.rmdir(self.real(path))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        return SFTP_OK

    def chattr(self, path, attr):
        try:
            paramiko.SFTPServer.set_file_attr(self.real(path), attr)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        return SFTP_OK


class _SftpSubsystem(paramiko.SFTPServer):
    """paramiko's SFTP server with our extensions and fault hooks in front of its dispatcher."""

    def __init__(self, channel, name, server, embedded: EmbeddedSftpServer) -> None:
        super().__init__(channel, name, server, _Filesystem, embedded)
        self.embedded = embedded
        self.written = 0

    def _cut(self) -> None:
        transport = self.sock.get_transport()
        transport.close()

    def _process(self, t, request_number, msg):
        faults = self.embedded.faults
        start = msg.packet.tell()
        if t == CMD_WRITE:
            msg.get_binary()  # handle
            msg.get_int64()  # offset
            size = len(msg.get_binary())
            msg.packet.seek(start)
            if faults.take_hang("write"):
                self.embedded.hang()
                self._cut()
                return
            faults.hold("write")
            with faults.lock:
                limit = faults.cut_after_write_bytes
                cut = limit is not None and self.written + size > limit
                if cut:
                    faults.cut_after_write_bytes = None
            if cut:
                faults.cut.set()
                self._cut()
                return
            self.written += size
            return super()._process(t, request_number, msg)
        if t == CMD_RENAME:
            oldpath, newpath = msg.get_text(), msg.get_text()
            return self._rename(request_number, oldpath, newpath, posix=False)
        if t == CMD_EXTENDED:
            tag = msg.get_text()
            if tag == "posix-rename@openssh.com":
                oldpath, newpath = msg.get_text(), msg.get_text()
                return self._rename(request_number, oldpath, newpath, posix=True)
            if tag == "check-file-name":
                return self._check_file_name(request_number, msg)
            # Includes paramiko's handle-based "check-file", which must never run (see module doc).
            return self._send_status(request_number, SFTP_OP_UNSUPPORTED)
        msg.packet.seek(start)
        return super()._process(t, request_number, msg)

    def _rename(self, request_number: int, oldpath: str, newpath: str, *, posix: bool) -> None:
        faults = self.embedded.faults
        fs: _Filesystem = self.server
        if faults.take_hang("rename"):
            # A server that took the request and never answers; nothing is renamed.
            self.embedded.hang()
            self._cut()
            return
        with faults.lock:
            plant, faults.occupy_before_rename = faults.occupy_before_rename, None
            drop, faults.drop_rename_reply = faults.drop_rename_reply, False
        if plant is not None:
            with open(fs.real(newpath), "wb") as late:
                late.write(plant)
            faults.occupied.set()
        status = fs.posix_rename(oldpath, newpath) if posix else fs.rename(oldpath, newpath)
        if drop:
            faults.rename_reply_dropped.set()
            self._cut()
            return
        self._send_status(request_number, status)

    def _check_file_name(self, request_number: int, msg: Message) -> None:
        if not self.embedded.remote_hash:
            return self._send_status(request_number, SFTP_OP_UNSUPPORTED)
        path = msg.get_text()
        algorithms = msg.get_text().split(",")
        offset = msg.get_int64()
        length = msg.get_int64()
        block_size = msg.get_int()
        if "sha256" not in algorithms or block_size != 0:
            return self._send_status(request_number, SFTP_OP_UNSUPPORTED, "only whole-file sha256")
        try:
            real = self.server.real(path)
            digest = sha256_file(real, offset, length)
        except FileNotFoundError:
            return self._send_status(request_number, SFTP_NO_SUCH_FILE)
        except PermissionError:
            return self._send_status(request_number, SFTP_PERMISSION_DENIED)
        except OSError:
            return self._send_status(request_number, SFTP_FAILURE)
        # ProFTPD's reply: the algorithm used, then the raw digest.
        reply = Message()
        reply.add_int(request_number)
        reply.add_string("sha256")
        reply.add_bytes(digest)
        self._send_packet(CMD_EXTENDED_REPLY, reply)


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

    def hang(self) -> None:
        """Block the calling request until the server stops: a peer that took a request and froze."""
        self.faults.release.wait()

    def acknowledge(self, final_path: str) -> None:
        """Write ``<final>.ack`` with the file's sha256 hex, atomically, as an accepting partner would."""
        if not self.acknowledgments or final_path.endswith(ACK_SUFFIX) or not os.path.isfile(final_path):
            return
        content = sha256_file(final_path).hex() + "\n"
        partial = final_path + ACK_SUFFIX + ".tmp"
        with open(partial, "w", encoding="ascii") as out:
            out.write(content)
        os.replace(partial, final_path + ACK_SUFFIX)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
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
        transport.set_subsystem_handler("sftp", _SftpSubsystem, self)
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
    parser = argparse.ArgumentParser(prog="python -m app.devtools.sftp_server", description=__doc__.split("\n")[0])
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
    address = server.start()
    print(address.known_hosts_line, flush=True)
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
