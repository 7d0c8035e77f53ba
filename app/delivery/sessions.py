"""Where a delivery gets its SSH session: a new one each time, or a worker process's pool of warm ones,
each holding one of its destination's session slots.

A partner allows only so many sessions at once (OpenSSH's ``MaxStartups`` drops a connection over its
limit during the banner or the key exchange), shared by every worker host. So a pooled session holds a
slot (``Slots``: in the worker, a database advisory lock keyed by the destination and a slot number)
from before it connects until it is closed; with no slot free, ``open`` raises ``SessionLimitReached``
and the attempt defers briefly instead of knocking at the partner's door.

Opening a session costs far more than using one (TCP, key exchange, authentication, the SFTP
subsystem: about 24 ms of the partner's CPU and more of ours), so every session a delivery hands back
as reusable stays open with its slot, up to ``max_idle`` over all destinations, and the next delivery
to its destination takes the most recently used one: a steady load on N threads keeps N sessions and
opens none. A session idle for ``idle_seconds`` is closed (its slot freed for other hosts) by one
reaper thread. A warm session is reused while its transport is up, without a round trip of its own:
the baseline listing every delivery makes first is the check, and ``Destination.prepare`` replaces a
warm session that fails it with a new one before concluding anything about the partner. A session
that saw an error is never given back as reusable, so it is closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from uuid import UUID

from app import logs
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential
from app.delivery.errors import SessionLimitReached
from app.delivery.hostkeys import PinnedKeys
from app.delivery.session import Session, open_session

log = logs.get(__name__)

#: Seconds an idle warm session stays open before the pool closes it (and frees its slot).
DEFAULT_IDLE_SECONDS = 30.0
#: Idle warm sessions one process keeps at most, over all destinations; each holds a slot.
DEFAULT_MAX_IDLE = 8


class Slot(Protocol):
    def release(self) -> None: ...


class Slots(Protocol):
    """Hands out a destination's session slots; None when all ``max_sessions`` are held."""

    def take(self, destination_id: UUID, max_sessions: int) -> Slot | None: ...


@dataclass(eq=False)
class HeldSession:
    """A session a delivery holds, with the slot it occupies, until it gives it back."""

    session: Session
    slot: Slot | None = None
    #: True when it was a warm session, kept from an earlier delivery.
    reused: bool = False
    key: tuple[UUID, DestinationConfig] | None = field(default=None, repr=False)


class SessionSource(Protocol):
    def open(self, config: DestinationConfig, pinned: PinnedKeys, credential: Credential) -> HeldSession: ...

    def give_back(self, held: HeldSession, *, reusable: bool) -> None: ...


class FreshSessions:
    """A new session for every delivery, closed when it is given back, and no slot: for inspections
    and for callers that keep no pool."""

    def open(self, config: DestinationConfig, pinned: PinnedKeys, credential: Credential) -> HeldSession:
        return HeldSession(open_session(config, pinned, credential))

    def give_back(self, held: HeldSession, *, reusable: bool) -> None:
        held.session.close()


@dataclass
class _Idle:
    held: HeldSession
    #: time.monotonic() when it was given back.
    since: float


class SessionPool:
    """A worker process's sessions to partners: each within its destination's slots, every one handed back
    reusable kept warm until it idles out. Thread-safe."""

    def __init__(self, slots: Slots | None = None, *, idle_seconds: float = DEFAULT_IDLE_SECONDS,
                 max_idle: int = DEFAULT_MAX_IDLE, connect: Callable[..., Session] = open_session) -> None:
        self.slots = slots
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self._connect = connect
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        #: Per destination, most recently given back last.
        self._idle: dict[tuple[UUID, DestinationConfig], list[_Idle]] = {}
        self._reaper: threading.Thread | None = None
        self._closed = False
        #: Counts, for logs, benchmarks and tests: sessions opened (logins) and warm ones reused.
        self.opened = 0
        self.reused = 0

    def for_destination(self, destination_id: UUID) -> SessionSource:
        return _Bound(self, destination_id)

    def open(self, destination_id: UUID, config: DestinationConfig, pinned: PinnedKeys,
             credential: Credential) -> HeldSession:
        """A session to the destination, warm if one is idle with its transport up; raises
        SessionLimitReached when no slot is free, and the connection's error when it cannot be opened
        (the slot is freed)."""
        key = (destination_id, config)
        dead: list[HeldSession] = []
        warm: HeldSession | None = None
        with self._lock:
            stack = self._idle.get(key, [])
            while stack and warm is None:
                candidate = stack.pop().held
                if _transport_up(candidate):
                    warm = candidate
                else:
                    dead.append(candidate)
            if not stack:
                self._idle.pop(key, None)
            if warm is not None:
                self.reused += 1
        for held in dead:
            _close(held)
        if warm is not None:
            warm.reused = True
            return warm
        slot = self.slots.take(destination_id, config.max_sessions) if self.slots is not None else None
        if self.slots is not None and slot is None:
            raise SessionLimitReached(f"all {config.max_sessions} sessions to the destination are in use")
        try:
            session = self._connect(config, pinned, credential)
        except BaseException:
            _release(slot)
            raise
        with self._lock:
            self.opened += 1
        return HeldSession(session, slot, reused=False, key=key)

    def give_back(self, held: HeldSession, *, reusable: bool) -> None:
        """Keeps the session warm when the delivery says it may be reused and the pool has room; closes it
        (and frees its slot) otherwise."""
        key = held.key
        if reusable and key is not None and _transport_up(held):
            with self._lock:
                if not self._closed and self._idle_count() < self.max_idle:
                    self._idle.setdefault(key, []).append(_Idle(held, time.monotonic()))
                    self._start_reaper()
                    self._changed.notify()
                    return
        _close(held)

    def _idle_count(self) -> int:
        return sum(len(stack) for stack in self._idle.values())

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="session-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Closes the sessions idle for ``idle_seconds``, sleeping until the next one is due."""
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                expired = [entry.held for stack in self._idle.values() for entry in stack
                           if now - entry.since >= self.idle_seconds]
                for key in list(self._idle):
                    self._idle[key] = [e for e in self._idle[key] if now - e.since < self.idle_seconds]
                    if not self._idle[key]:
                        del self._idle[key]
                if not expired:
                    due = [entry.since + self.idle_seconds - now for stack in self._idle.values() for entry in stack]
                    self._changed.wait(timeout=min(due) if due else None)
                    continue
            for held in expired:
                log.info("destination.session_idle_closed", destination_id=held.key[0] if held.key else None)
                _close(held)

    def close(self) -> None:
        """Closes every idle session and frees its slot; sessions in use close when given back."""
        with self._lock:
            self._closed = True
            idle = [entry.held for stack in self._idle.values() for entry in stack]
            self._idle = {}
            self._changed.notify_all()
        for held in idle:
            _close(held)

    @property
    def idle(self) -> int:
        with self._lock:
            return self._idle_count()


def _transport_up(held: HeldSession) -> bool:
    transport = held.session.client.get_transport()
    return transport is not None and transport.is_active()


@dataclass(frozen=True)
class _Bound:
    """The pool, for one destination: what ``Destination.prepare`` asks for a session."""

    pool: SessionPool
    destination_id: UUID

    def open(self, config: DestinationConfig, pinned: PinnedKeys, credential: Credential) -> HeldSession:
        return self.pool.open(self.destination_id, config, pinned, credential)

    def give_back(self, held: HeldSession, *, reusable: bool) -> None:
        self.pool.give_back(held, reusable=reusable)


def _close(held: HeldSession) -> None:
    held.session.close()
    _release(held.slot)


def _release(slot: Slot | None) -> None:
    if slot is None:
        return
    try:
        slot.release()
    except Exception:   # a slot whose release fails is freed with its database session
        log.warning("destination.slot_release_failed", exc_info=True)
