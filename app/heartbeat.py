"""A process's heartbeat: the relay, every worker process and the scheduler record that they are alive,
every few seconds, on a connection of their own, and say goodbye on a clean shutdown.

``exports health`` and ``exports processes`` read the records, and the scheduler's metrics count the
live ones; the protocol never does. A beat that fails is logged and tried again at the next interval:
a database blip must not stop a process that is otherwise healthy.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import UTC, datetime

from app import __version__, logs
from app.store import heartbeat
from app.store.database import Database
from app.store.heartbeat import ProcessIdentity

log = logs.get(__name__)

#: Seconds between beats.
DEFAULT_INTERVAL_SECONDS = 10.0
#: A process silent for this many intervals counts as dead.
SILENT_INTERVALS = 3


def identity(role: str) -> ProcessIdentity:
    """This process: ``host:pid``, the prefix of the ``claimed_by`` of every attempt it claims. A worker
    process is one of the children Dramatiq forks; the process a supervisor or an operator signals is its
    parent, the ``exports worker`` (or ``dramatiq``) command, recorded beside it."""
    host, pid = socket.gethostname(), os.getpid()
    return ProcessIdentity(f"{host}:{pid}", role, host, pid, __version__, datetime.now(UTC),
                           os.getppid() if role == "worker" else None)


class Heartbeat:
    """Beats for one process until ``stop()``; a daemon thread, so it never holds a process up."""

    def __init__(self, db: Database, role: str, *, interval_seconds: float = DEFAULT_INTERVAL_SECONDS) -> None:
        self.db = db
        self.identity = identity(role)
        self.interval_seconds = interval_seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"exports-heartbeat-{role}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat_once(self) -> bool:
        try:
            with self.db.connection() as conn:
                return heartbeat.beat(conn, self.identity)
        except Exception as exc:
            log.warning("heartbeat.failed", role=self.identity.role, error=type(exc).__name__)
            return False

    def stop(self) -> None:
        """Stops beating and records a clean stop (best effort)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            with self.db.connection() as conn:
                heartbeat.stop(conn, self.identity)
        except Exception as exc:
            log.warning("heartbeat.stop_failed", role=self.identity.role, error=type(exc).__name__)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.beat_once()
            self._stopped.wait(self.interval_seconds)
