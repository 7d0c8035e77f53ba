"""The embedded partner's fault hooks (``exports_devtools.sftp_subsystem`` consults them at each request).

``Faults``' fields place one interruption exactly, for the tests: cut the connection after N bytes of
writes, drop the reply to a rename after performing it, create a file under the rename's target just
before the rename, or hang or hold a request. Each fires once and sets an event, so tests wait on
events rather than sleeping.

Those fields serve one fault at a time. ``Faults.arm(...)`` returns a ``Trap`` with events of its own,
so several faults can be armed at once from several threads (the chaos soak does): hold an open, a
write past N bytes of its file, a rename before or after it is performed; cut the connection at a
write past N bytes; drop a rename's reply. ``Trap.path`` says which file it caught.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

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

