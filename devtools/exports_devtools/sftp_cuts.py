"""A connection cut after one SFTP request was sent and performed, before its answer is read: the
interruption that leaves a delivery's outcome unknown, placed exactly, against any real server.

A real server's SSH stream is encrypted, so no proxy can tell a rename from any other request. The cut is
made at the client instead, which knows: while ``cut_after_request`` is active, paramiko's next request
of the kind asked for (a rename, a posix-rename, a create) whose target path holds the text asked for is
sent and the client's connection closed at once, behind it; once ``performed()`` says the server did
it (the test looks at the server's directory), paramiko's wait for the answer raises as on any
connection lost then (``SSHException: Server connection dropped``). The server performed the request;
the answer was lost. (A server that drops a request arriving with the connection's end would leave
``Cut.performed`` false: the tests assert it.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import paramiko
from paramiko.sftp import CMD_EXTENDED, CMD_OPEN, CMD_RENAME, SFTP_FLAG_CREATE

#: The requests that can be cut, by the name a test uses: the SFTP request type and where, among the
#: request's arguments, its target path is. "create" is an open that creates (an exclusive create, as
#: uploads and markers make), never one that reads.
REQUESTS = {"rename": (CMD_RENAME, 1), "posix-rename": (CMD_EXTENDED, 2), "create": (CMD_OPEN, 0)}
#: Seconds to wait for ``performed()`` before cutting anyway (the test then sees the request not performed).
PERFORMED_TIMEOUT = 10.0


@dataclass
class Cut:
    """One armed cut; ``fired`` is set once the connection was closed, with ``performed`` saying whether the
    server had performed the request by then."""

    request: str
    target_contains: str
    fired: threading.Event = field(default_factory=threading.Event)
    performed: bool = False
    target: str | None = None

    def matches(self, kind: int, args: tuple[object, ...]) -> bool:
        expected, position = REQUESTS[self.request]
        if kind != expected or self.fired.is_set() or len(args) <= position:
            return False
        if kind == CMD_EXTENDED and args[0] != "posix-rename@openssh.com":
            return False
        if kind == CMD_OPEN and not (isinstance(args[1], int) and args[1] & SFTP_FLAG_CREATE):
            return False
        target = _text(args[position])
        return target is not None and self.target_contains in target


@contextmanager
def cut_after_request(request: str, *, target_contains: str, performed: Callable[[], bool]) -> Iterator[Cut]:
    """While active, the next ``request`` ("rename", "posix-rename", "create") whose target path contains
    ``target_contains`` is sent, and the client's connection closed once ``performed()`` (or after
    PERFORMED_TIMEOUT), before the answer is read. Every other request passes unchanged."""
    if request not in REQUESTS:
        raise ValueError(f"no cut after {request!r}; one of {sorted(REQUESTS)}")
    cut = Cut(request, target_contains)
    original = paramiko.SFTPClient._request

    def _request(self: paramiko.SFTPClient, kind: int, *args: object):
        if not cut.matches(kind, args):
            return original(self, kind, *args)
        number = self._async_request(type(None), kind, *args)
        # Closed as soon as the request is on its way (close() joins the thread that reads the socket),
        # and whatever the server answered meanwhile dropped from the channel's buffer: the answer is
        # lost as on a link cut behind the request. The server has the request and performs it.
        transport = self.sock.get_transport()
        if transport is not None:
            transport.close()
        self.sock.in_buffer.empty()
        deadline = time.monotonic() + PERFORMED_TIMEOUT
        while not (done := _asked(performed)) and time.monotonic() < deadline:
            time.sleep(0.01)
        cut.performed, cut.target = done, _text(args[REQUESTS[cut.request][1]])
        cut.fired.set()
        return self._read_response(number)   # raises: the connection is gone

    paramiko.SFTPClient._request = _request
    try:
        yield cut
    finally:
        paramiko.SFTPClient._request = original


def _text(path: object) -> str | None:
    """A request's path as paramiko passes it (bytes, after its cwd adjustment, or str)."""
    if isinstance(path, bytes):
        return path.decode("utf-8", errors="replace")
    return path if isinstance(path, str) else None


def _asked(performed: Callable[[], bool]) -> bool:
    # A look at a directory the server is changing can fail part way; it must never reach the caller
    # of the cut request, where it would read as the server's answer.
    try:
        return performed()
    except Exception:
        return False
