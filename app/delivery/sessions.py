"""Where a delivery gets its SSH session: a new one each time, or a worker process's pool of warm ones,
each holding one of its destination's session slots.

A partner allows only so many sessions at once (OpenSSH's ``MaxStartups`` drops a connection over its
limit during the banner or the key exchange), shared by every worker host. So a pooled session holds a
slot (``Slots``: in the worker, a database advisory lock keyed by the destination and a slot number)
from before it connects until it is closed; with no slot free, ``open`` raises ``SessionLimitReached``
and the attempt defers briefly instead of knocking at the partner's door.

Opening a session costs far more than using one (TCP, key exchange, authentication, the SFTP
subsystem), so the pool keeps one idle session per destination open between deliveries, with its slot,
and closes it once it has been idle for ``idle_seconds``. A warm session is reused only after it
passes ``Session.healthy`` (the transport is up and the server answers a stat of the remote directory);
on any doubt it is closed and a new one is opened on the same slot. Only what the delivery hands back
as reusable goes back to the pool: a session that saw an error is closed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from uuid import UUID

import paramiko

from app import logs
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential
from app.delivery.errors import SessionLimitReached
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
    def open(self, config: DestinationConfig, pinned: paramiko.PKey, credential: Credential) -> HeldSession: ...

    def give_back(self, held: HeldSession, *, reusable: bool) -> None: ...


class FreshSessions:
    """A new session for every delivery, closed when it is given back, and no slot: for inspections
    and for callers that keep no pool."""

    def open(self, config: DestinationConfig, pinned: paramiko.PKey, credential: Credential) -> HeldSession:
        return HeldSession(open_session(config, pinned, credential))

    def give_back(self, held: HeldSession, *, reusable: bool) -> None:
        held.session.close()


@dataclass
class _Idle:
    held: HeldSession
    timer: threading.Timer


class SessionPool:
    """A worker process's sessions to partners: each within its destination's slots, one kept warm per
    destination between deliveries. Thread-safe."""

    def __init__(self, slots: Slots | None = None, *, idle_seconds: float = DEFAULT_IDLE_SECONDS,
                 max_idle: int = DEFAULT_MAX_IDLE, connect: Callable[..., Session] = open_session) -> None:
        self.slots = slots
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self._connect = connect
        self._lock = threading.Lock()
        self._idle: dict[tuple[UUID, DestinationConfig], _Idle] = {}
        self._closed = False
        #: Counts, for logs, benchmarks and tests.
        self.opened = 0
        self.reused = 0

    def for_destination(self, destination_id: UUID) -> SessionSource:
        return _Bound(self, destination_id)

    def open(self, destination_id: UUID, config: DestinationConfig, pinned: paramiko.PKey,
             credential: Credential) -> HeldSession:
        """A healthy session to the destination, warm if one is idle; raises SessionLimitReached when
        no slot is free, and the connection's error when it cannot be opened (the slot is freed)."""
        key = (destination_id, config)
        with self._lock:
            idle = self._idle.pop(key, None)
        if idle is not None:
            idle.timer.cancel()
            if idle.held.session.healthy(config.remote_dir, config.io_timeout):
                idle.held.reused = True
                with self._lock:
                    self.reused += 1
                return idle.held
            idle.held.session.close()   # on any doubt: a new session, on the same slot
            slot = idle.held.slot
        else:
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
        """Keeps the session warm when the delivery says it may be reused, the pool has room and no other
        session to its destination is idle; closes it (and frees its slot) otherwise."""
        key = held.key
        transport = held.session.client.get_transport()
        if reusable and key is not None and transport is not None and transport.is_active():
            with self._lock:
                if not self._closed and key not in self._idle and len(self._idle) < self.max_idle:
                    timer = threading.Timer(self.idle_seconds, self._expire, args=(key, held))
                    timer.daemon = True
                    self._idle[key] = _Idle(held, timer)
                    timer.start()
                    return
        _close(held)

    def _expire(self, key: tuple[UUID, DestinationConfig], held: HeldSession) -> None:
        with self._lock:
            idle = self._idle.get(key)
            if idle is None or idle.held is not held:
                return   # taken for a delivery (or replaced) since the timer started
            del self._idle[key]
        log.info("destination.session_idle_closed", destination_id=key[0])
        _close(held)

    def close(self) -> None:
        """Closes every idle session and frees its slot; sessions in use close when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle.values()), {}
        for entry in idle:
            entry.timer.cancel()
            _close(entry.held)

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)


@dataclass(frozen=True)
class _Bound:
    """The pool, for one destination: what ``Destination.prepare`` asks for a session."""

    pool: SessionPool
    destination_id: UUID

    def open(self, config: DestinationConfig, pinned: paramiko.PKey, credential: Credential) -> HeldSession:
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
