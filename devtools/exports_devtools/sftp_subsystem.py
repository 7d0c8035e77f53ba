"""The SFTP subsystem of the embedded partner (``exports_devtools.sftp_server``): what one session sees.

It behaves like the partners we meet, where it matters to delivery:
- every path chrooted to a root directory;
- OpenSSH rename semantics: SSH_FXP_RENAME refuses an existing target with the generic "Failure"
  (it is link() then unlink(), as in OpenSSH's sftp-server), ``posix-rename@openssh.com`` replaces;
- optionally ProFTPD's ``check-file-name`` sha256 extension, implemented here: paramiko's own
  server-side check-file loops for ever on files over 131,072 bytes, and ProFTPD rejects that name
  anyway, so the handle-based ``check-file`` is reported unsupported;
- optionally the partner's acknowledgment: after a successful rename, ``<final>.ack`` holding the
  sha256 hex of the file.

Its fault hooks (``Faults``, ``Trap``) are in ``exports_devtools.sftp_faults``; it consults them at each
request.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
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

from exports_devtools.sftp_faults import Faults, Trap

ACK_SUFFIX = ".ack"
#: Bytes read at a time when hashing a file for check-file-name or an acknowledgment.
HASH_CHUNK = 1 << 20


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
