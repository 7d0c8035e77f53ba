"""The stop watcher: notices a recorded stop request quickly, for speed and never for correctness.

One watcher per worker process holds one connection that LISTENs on ``exports_stop`` (the payload is
the job id; a trigger sends it when ``stop_request_id`` is first set) and polls every
``poll_seconds`` as a fallback, because a notification can be lost (a reconnect, a listener that
started late). Either way the request is confirmed against the row: the job is Running, owned by the
watched attempt, with a stop request recorded. Only then is the attempt's stop signal set.

Cutoff 2 refuses delivery after a recorded stop request whether or not the watcher saw it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg

from app import logs
from app.actors.stop import StopReason, StopSignal
from app.store import connector
from app.store import worker as worker_reads
from app.store.database import connect
from app.store.types import Role

log = logs.get(__name__)

CHANNEL = "exports_stop"
#: The longest the listener blocks before it looks at newly registered watches, in seconds.
TICK_SECONDS = 0.1
#: Seconds between attempts to reconnect after the watcher's connection failed.
RECONNECT_SECONDS = 1.0
#: Seconds a notification for a job nobody watches yet is remembered: a stop recorded between a claim's
#: commit and its watch's registration notifies before there is anyone to tell. Past this, the poll
#: finds it (a registration that late is a paused worker, which cutoff 2 fences anyway).
NOTIFIED_MEMORY_SECONDS = 60.0
APPLICATION_NAME = "exports-watcher"

@dataclass(frozen=True)
class _Watched:
    attempt_id: UUID
    stop: StopSignal
    #: The log fields bound where the attempt registered (its tenant, job, attempt and message).
    fields: Mapping[str, Any] = field(default_factory=dict)


class Watch:
    """One attempt's registration; ``close()`` (or leaving the ``with`` block) ends it."""

    def __init__(self, watcher: StopWatcher, job_id: UUID) -> None:
        self._watcher = watcher
        self.job_id = job_id

    def close(self) -> None:
        self._watcher._unwatch(self.job_id)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StopWatcher:
    """Watches any number of attempts in this process over one connection and one thread."""

    def __init__(self, url: str, *, poll_seconds: float, listen: bool = True,
                 connect_app: Callable[[], psycopg.Connection] | None = None) -> None:
        self.poll_seconds = poll_seconds
        self.listen = listen
        self._connect = connect_app or (lambda: connect(url, Role.APP, application_name=APPLICATION_NAME))
        self._lock = threading.Lock()
        self._watched: dict[UUID, _Watched] = {}
        self._unchecked: set[UUID] = set()
        #: Jobs notified while not watched, and when (the watcher's thread only).
        self._notified: dict[UUID, float] = {}
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: How each confirmed stop was found, for tests and the latency bench. Counted before the
        #: attempt's stop signal is visible as set, so whoever saw the signal set sees the count.
        self.confirmed_by_notify = 0
        self.confirmed_by_poll = 0
        #: Completed polls of every watched attempt; one after a registration means it was checked.
        self.polls = 0
        #: Rounds of the loop begun: one begun means every earlier round ended (for tests).
        self.ticks = 0

    # --- registration -----------------------------------------------------------------------------

    def watch(self, job_id: UUID, attempt_id: UUID, stop: StopSignal) -> Watch:
        """Watches one attempt. The row is checked at once too if the registration may have missed a
        request's notification: when the watcher does not listen, when it is (re)connecting (then it
        polls every watched attempt), or when the job was notified before it was watched. Otherwise
        a registration costs no query: a stop request is recorded only once the job is Running, that is
        after the claim, and the listener heard every notification since."""
        with self._lock:
            self._watched[job_id] = _Watched(attempt_id, stop, logs.current())
            self._unchecked.add(job_id)
            self._ensure_thread()
        return Watch(self, job_id)

    def _unwatch(self, job_id: UUID) -> None:
        with self._lock:
            self._watched.pop(job_id, None)
            self._unchecked.discard(job_id)

    def close(self) -> None:
        self._closed.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="exports-stop-watcher", daemon=True)
            self._thread.start()

    # --- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        next_poll = 0.0
        while not self._closed.is_set():
            self.ticks += 1
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                    if self.listen:
                        connector.listen(conn, CHANNEL)
                    next_poll = 0.0   # whatever was sent while we were away is lost: poll now
                notified: set[UUID] = set()
                if self.listen:
                    for notify in conn.notifies(timeout=TICK_SECONDS, stop_after=1):
                        try:
                            notified.add(UUID(notify.payload))
                        except ValueError:
                            log.warning("watcher.bad_payload")
                    self._remember(notified)
                else:
                    self._closed.wait(TICK_SECONDS)
                with self._lock:
                    if not self._watched:
                        if next_poll:
                            # The poll's clock runs while something is watched: a watch after a quiet
                            # spell costs no poll of its own (its registration is checked as it needs).
                            next_poll = max(next_poll, time.monotonic() + self.poll_seconds)
                        continue
                    fresh, self._unchecked = self._unchecked, set()
                if notified:
                    self._confirm(conn, notified, by_notify=True)
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_seconds
                    self._confirm(conn, None, by_notify=False)
                    self.polls += 1
                else:
                    missed = (fresh if not self.listen else fresh & self._notified.keys()) - notified
                    if missed:
                        self._confirm(conn, missed, by_notify=False)
            except Exception as exc:
                log.warning("watcher.connection_failed", error=type(exc).__name__)
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
                self._closed.wait(RECONNECT_SECONDS)
        if conn is not None:
            conn.close()

    def _remember(self, notified: set[UUID]) -> None:
        now = time.monotonic()
        for job_id in notified:
            self._notified.pop(job_id, None)
            self._notified[job_id] = now   # kept in the order heard, so the oldest are first
        while self._notified:
            job_id, heard = next(iter(self._notified.items()))
            if heard >= now - NOTIFIED_MEMORY_SECONDS:
                break
            del self._notified[job_id]

    def _count_notify(self) -> None:
        self.confirmed_by_notify += 1

    def _count_poll(self) -> None:
        self.confirmed_by_poll += 1

    def _confirm(self, conn: psycopg.Connection, job_ids: set[UUID] | None, *, by_notify: bool) -> None:
        """Confirms against the row, for the given jobs or every watched one."""
        with self._lock:
            targets = {job_id: w for job_id, w in self._watched.items()
                       if (job_ids is None or job_id in job_ids) and not w.stop.is_set()}
        if not targets:
            return
        stopped = worker_reads.confirm_stops(conn, {job_id: w.attempt_id for job_id, w in targets.items()})
        for job_id in stopped:
            watched = targets[job_id]
            # This thread watches every attempt of the process: each stop is bound to its own, so the
            # callbacks' lines (the builder's query cancel) carry the attempt they stop.
            with logs.bound(**{**watched.fields, "job_id": job_id, "attempt_id": watched.attempt_id}):
                # Counted as part of setting the signal, before it wakes the runner: set() returns only
                # after its callbacks (the builder's query cancel), by which time the run may have ended.
                if watched.stop.set(StopReason.STOP_REQUESTED,
                                    before_wake=self._count_notify if by_notify else self._count_poll):
                    log.info("watcher.stop_confirmed", via="notify" if by_notify else "poll")
