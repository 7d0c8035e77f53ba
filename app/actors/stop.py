"""The stop source of one attempt: set once, by whoever notices first, with the reason.

A recorded stop request (the watcher), a renewal that changed no row (the lease keeper) and a worker
shutdown all end preparation the same way; the reason decides what the runner may then write.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable

from app import logs

log = logs.get(__name__)


class StopReason(enum.Enum):
    #: The watcher confirmed a recorded stop request for this attempt: the runner records Stopped.
    STOP_REQUESTED = "StopRequested"
    #: A renewal changed no row: a takeover committed, the attempt owns nothing and writes nothing.
    LEASE_LOST = "LeaseLost"
    #: The worker process is shutting down: the job stays Running and recovery takes it over.
    SHUTDOWN = "Shutdown"


class StopSignal:
    """A ``threading.Event`` with the first reason it was set for, and callbacks run once when set
    (the builder uses one to cancel its running query, so a stop is not held up by the database)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: StopReason | None = None
        self._set_at: float | None = None
        self._callbacks: list[Callable[[StopReason], None]] = []

    def set(self, reason: StopReason, *, before_wake: Callable[[], None] | None = None) -> bool:
        """Sets the signal; False when it was already set (the first reason stands).

        ``before_wake`` runs only if this call is the one that sets the signal, and before the signal
        is visible as set: whoever then sees it set (a runner ending its build) also sees what it
        recorded. It must be quick and must not block; the signal is set even if it raises."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            self._set_at = time.monotonic()
            callbacks = list(self._callbacks)
            try:
                if before_wake is not None:
                    before_wake()
            finally:
                self._event.set()
        for callback in callbacks:
            self._run(callback, reason)
        return True

    def seconds_since_set(self) -> float:
        """How long ago the signal was set (0 if it is not): how long obeying it took so far."""
        return 0.0 if self._set_at is None else time.monotonic() - self._set_at

    @property
    def reason(self) -> StopReason | None:
        return self._reason

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def on_set(self, callback: Callable[[StopReason], None]) -> Callable[[], None]:
        """Runs ``callback(reason)`` when the signal is set (at once if it already is); returns a
        function that unregisters it."""
        with self._lock:
            reason = self._reason
            if reason is None:
                self._callbacks.append(callback)
        if reason is not None:
            self._run(callback, reason)

        def remove() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return remove

    @staticmethod
    def _run(callback: Callable[[StopReason], None], reason: StopReason) -> None:
        try:
            callback(reason)
        except Exception:   # a callback must never keep the signal from reaching the others
            log.exception("stop.callback_failed", reason=reason.value)

    def __repr__(self) -> str:
        return f"StopSignal(reason={self._reason.value if self._reason else None})"
