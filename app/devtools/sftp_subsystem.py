"""The SFTP subsystem of the embedded partner (``app.devtools.sftp_server``): what one session sees.

It behaves like the partners we meet, where it matters to delivery:
- every path chrooted to a root directory;
- OpenSSH rename semantics: SSH_FXP_RENAME refuses an existing target with the generic "Failure"
  (it is link() then unlink(), as in OpenSSH's sftp-server), ``posix-rename@openssh.com`` replaces;
- optionally ProFTPD's ``check-file-name`` sha256 extension, implemented here: paramiko's own
  server-side check-file loops for ever on files over 131,072 bytes, and ProFTPD rejects that name
  anyway, so the handle-based ``check-file`` is reported unsupported;
- optionally the partner's acknowledgment: after a successful rename, ``<final>.ack`` holding the
  sha256 hex of the file.

Fault hooks (``Faults``) let tests place an interruption exactly: cut the connection after N bytes of
writes, drop the reply to a rename after performing it, create a file under the rename's target just
before the rename, or hang or hold a request. Each fires once and sets an event, so tests wait on
events rather than sleeping.

The fields of ``Faults`` serve one fault at a time. ``Faults.arm(...)`` returns a ``Trap`` with events
of its own, so several faults can be armed at once from several threads (the chaos soak does):
hold an open, a write past N bytes of its file, a rename before or after it is performed; cut the
connection at a write past N bytes; drop a rename's reply. ``Trap.path`` says which file it caught.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import paramiko
from paramiko.message import Message
from paramiko.sftp import (
    CMD_EXTENDED,
    CMD_EXTENDED_REPLY,
    CMD_OPEN,
    CMD_RENAME,
    CMD_STAT,
    CMD_WRITE,
    SFTP_FAILURE,
    SFTP_NO_SUCH_FILE,
    SFTP_OK,
    SFTP_OP_UNSUPPORTED,
    SFTP_PERMISSION_DENIED,
)

ACK_SUFFIX = ".ack"
#: Where a ``Trap`` waits: the request kinds it can catch. "renamed" is a rename performed, its reply
#: not yet sent.
TRAP_POINTS = ("open", "write", "stat", "rename", "renamed")
#: What a ``Trap`` does there: wait until released, close the connection, or (renames) perform the
#: rename and close the connection instead of replying.
TRAP_ACTIONS = ("hold", "cut", "drop-reply")
#: Seconds between two looks, while a request is held, at whether the server is stopping.
HOLD_POLL = 0.1


@dataclass(eq=False)
class Trap:
    """One armed one-shot fault: at the next request of kind ``at`` whose path contains
    ``path_contains`` (and, for writes, whose end passes ``after_bytes`` of its file), do ``action``.
    ``reached`` is set when it fires, with ``path`` (and ``source``, a rename's old path) filled in;
    a hold waits until ``release()``."""

    at: str
    action: str = "hold"
    path_contains: str | None = None
    after_bytes: int | None = None
    reached: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)
    path: str | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        if self.at not in TRAP_POINTS or self.action not in TRAP_ACTIONS:
            raise ValueError(f"no trap {self.action!r} at {self.at!r}")
        if self.action == "drop-reply" and self.at != "rename":
            raise ValueError("only a rename's reply can be dropped")

    def release(self) -> None:
        self.resume.set()

    def matches(self, at: str, path: str, end: int) -> bool:
        return (self.at == at and (self.path_contains is None or self.path_contains in path)
                and (self.after_bytes is None or end > self.after_bytes))
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
    traps: list[Trap] = field(default_factory=list)
    #: Traps that fired and hold a request, until released (``release_traps`` releases them all).
    sprung: list[Trap] = field(default_factory=list)

    def arm(self, at: str, action: str = "hold", *, path_contains: str | None = None,
            after_bytes: int | None = None) -> Trap:
        trap = Trap(at, action, path_contains, after_bytes)
        with self.lock:
            self.traps.append(trap)
        return trap

    def disarm(self, trap: Trap) -> bool:
        """Takes back a trap; False when a request has already taken it."""
        with self.lock:
            for index, armed in enumerate(self.traps):
                if armed is trap:
                    del self.traps[index]
                    return True
        return False

    def release_traps(self) -> None:
        """Disarms every trap and releases every held request."""
        with self.lock:
            traps, self.traps = self.traps, []
            sprung, self.sprung = self.sprung, []
        for trap in traps + sprung:
            trap.release()

    def spring(self, at: str, path: str, end: int = 0, source: str | None = None) -> Trap | None:
        """The first armed trap for this request, taken (it fires once), its ``reached`` set."""
        with self.lock:
            for index, trap in enumerate(self.traps):
                if trap.matches(at, path, end):
                    del self.traps[index]
                    if trap.action == "hold":
                        self.sprung = [t for t in self.sprung if not t.resume.is_set()] + [trap]
                    break
            else:
                return None
        trap.path, trap.source = path, source
        trap.reached.set()
        return trap

    def wait_released(self, trap: Trap) -> None:
        """Blocks a held request until its trap is released or the server stops."""
        while not trap.resume.wait(HOLD_POLL):
            if self.release.is_set():
                return

    def hold(self, kind: str) -> None:
        with self.lock:
            if kind not in self.hold_on:
                return
            self.hold_on = self.hold_on - {kind}
        self.held.set()
        self.resume.wait()

    def hang(self) -> None:
        """Blocks the calling request until the server stops: a peer that took a request and froze."""
        self.release.wait()

    def take_hang(self, kind: str) -> bool:
        with self.lock:
            if kind not in self.hang_on:
                return False
            self.hang_on = self.hang_on - {kind}
        self.hanging.set()
        return True


class Peer(Protocol):
    """What a session needs of the server it runs in, read at each request: a test may switch them on a
    running server."""

    root: Path
    faults: Faults
    remote_hash: bool
    acknowledgments: bool


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


def acknowledge(final_path: str) -> None:
    """Writes ``<final>.ack`` with the file's sha256 hex, atomically, as an accepting partner would."""
    if final_path.endswith(ACK_SUFFIX) or not os.path.isfile(final_path):
        return
    content = sha256_file(final_path).hex() + "\n"
    partial = final_path + ACK_SUFFIX + ".tmp"
    with open(partial, "w", encoding="ascii") as out:
        out.write(content)
    os.replace(partial, final_path + ACK_SUFFIX)


class _Handle(paramiko.SFTPHandle):
    def stat(self):
        # fstat: paramiko's prefetch (a read-back) asks for the size through the handle.
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)


class _Filesystem(paramiko.SFTPServerInterface):
    """The chrooted filesystem one SFTP session sees."""

    def __init__(self, server: paramiko.ServerInterface, peer: Peer) -> None:
        super().__init__(server)
        self.peer = peer
        self.root = os.path.realpath(peer.root)

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
        if self.peer.faults.take_hang("stat"):
            self.peer.faults.hang()
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
        if self.peer.faults.take_hang("open"):
            self.peer.faults.hang()
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
        self._acknowledge(new)
        return SFTP_OK

    def posix_rename(self, oldpath, newpath):
        try:
            new = self.real(newpath)
            os.rename(self.real(oldpath), new)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        self._acknowledge(new)
        return SFTP_OK

    def _acknowledge(self, final_path: str) -> None:
        # Every successful rename passes here: the peer may keep a journal of them.
        on_rename: Callable[[str], None] | None = getattr(self.peer, "on_rename", None)
        if on_rename is not None:
            on_rename(final_path)
        if self.peer.acknowledgments:
            acknowledge(final_path)

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


class Subsystem(paramiko.SFTPServer):
    """paramiko's SFTP server with our extensions and fault hooks in front of its dispatcher."""

    def __init__(self, channel, name, server, peer: Peer) -> None:
        super().__init__(channel, name, server, _Filesystem, peer)
        self.peer = peer
        self.written = 0

    def _cut(self) -> None:
        transport = self.sock.get_transport()
        transport.close()

    def _trapped(self, trap: Trap | None) -> bool:
        """Does what a sprung trap says; True when the request must go no further (the link is cut)."""
        if trap is None:
            return False
        if trap.action == "cut":
            self._cut()
            return True
        self.peer.faults.wait_released(trap)
        return False

    def _path_of(self, handle: bytes) -> str:
        opened = self.file_table.get(handle)
        return str(getattr(opened, "filename", "") or "")

    def _process(self, t, request_number, msg):
        faults = self.peer.faults
        start = msg.packet.tell()
        if t in (CMD_OPEN, CMD_STAT):
            path = msg.get_text()
            msg.packet.seek(start)
            if self._trapped(faults.spring("open" if t == CMD_OPEN else "stat", path)):
                return
        if t == CMD_WRITE:
            handle = msg.get_binary()
            offset = msg.get_int64()
            size = len(msg.get_binary())
            msg.packet.seek(start)
            if self._trapped(faults.spring("write", self._path_of(handle), offset + size)):
                return
            if faults.take_hang("write"):
                faults.hang()
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
        faults = self.peer.faults
        fs: _Filesystem = self.server
        if faults.take_hang("rename"):
            # A server that took the request and never answers; nothing is renamed.
            faults.hang()
            self._cut()
            return
        trap = faults.spring("rename", newpath, source=oldpath)
        if trap is not None and trap.action != "drop-reply" and self._trapped(trap):
            return
        with faults.lock:
            plant, faults.occupy_before_rename = faults.occupy_before_rename, None
            drop, faults.drop_rename_reply = faults.drop_rename_reply, False
        if plant is not None:
            with open(fs.real(newpath), "wb") as late:
                late.write(plant)
            faults.occupied.set()
        status = fs.posix_rename(oldpath, newpath) if posix else fs.rename(oldpath, newpath)
        if drop or (trap is not None and trap.action == "drop-reply"):
            if drop:
                faults.rename_reply_dropped.set()
            self._cut()
            return
        if status == SFTP_OK and self._trapped(faults.spring("renamed", newpath, source=oldpath)):
            return
        self._send_status(request_number, status)

    def _check_file_name(self, request_number: int, msg: Message) -> None:
        if not self.peer.remote_hash:
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
