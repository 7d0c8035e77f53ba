"""A partner's quick ingestion, played in front of any SFTP server whose directory is on this machine: a
thread that moves every file arriving in the inbox to a directory of its own the moment it appears, as
partners whose ingestion picks a file up at once do (paramiko's ``put(confirm=True)`` then fails a
successful upload: paramiko issues 1843, 149).

It takes what the partner's agreement says it takes: any file whose name does not start with a dot, so
the temporary dot-names an upload writes before its rename (``.<name>.<attempt>.part``) are left alone,
and so are the scratch dot-names ``exports destination check`` probes under. Linux's inotify wakes it as
a name appears (a rename onto the name, or a file created there), with a short poll behind it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import threading
from pathlib import Path

#: inotify's events for a name that appears in a directory: created there, or renamed onto.
_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80
#: Seconds between two looks at the directory when no event woke the thread (the poll behind inotify).
POLL_SECONDS = 0.02


class QuickIngestion:
    """Moves each file that appears in ``inbox`` (no leading dot) to ``taken`` at once; ``taken_names()``
    lists what it took. A context manager: ``stop()`` when it ends."""

    def __init__(self, inbox: Path, taken: Path) -> None:
        self.inbox = inbox
        self.taken = taken
        taken.mkdir(parents=True, exist_ok=True)
        self._stop = threading.Event()
        self._notify = _inotify(inbox)
        self._thread = threading.Thread(target=self._run, name="quick-ingestion", daemon=True)
        self._thread.start()

    def __enter__(self) -> QuickIngestion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def taken_names(self) -> list[str]:
        return sorted(p.name for p in self.taken.iterdir())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._notify is not None:
            os.close(self._notify)
            self._notify = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take_all()
            if self._notify is None:
                self._stop.wait(POLL_SECONDS)
                continue
            ready, _, _ = select.select([self._notify], [], [], POLL_SECONDS)
            if ready:
                os.read(self._notify, 65536)   # what arrived does not matter: every name is looked at

    def _take_all(self) -> None:
        try:
            entries = list(os.scandir(self.inbox))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                os.rename(entry.path, self.taken / entry.name)
            except FileNotFoundError:
                pass   # gone meanwhile: removed by its writer, or taken already


def _inotify(directory: Path) -> int | None:
    """An inotify descriptor watching ``directory`` for names that appear; None where there is no inotify
    (then the thread polls)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    try:
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except AttributeError:
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CREATE | _IN_MOVED_TO) < 0:
        os.close(fd)
        return None
    return fd
