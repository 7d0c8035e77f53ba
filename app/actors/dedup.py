"""Deduplication of wake-up messages by message id.

Dramatiq's Redis broker does not deduplicate: the same ``message_id`` enqueued twice runs twice. This
middleware records a message id once its processing returned normally, and skips (and so acks) a copy
that arrives later. A message whose processing raised is not recorded, because Dramatiq's retry
enqueues it again under the same id and that retry must run.

This is an optimisation, not the guard: two copies processed at the same time both pass, a record can
expire, and records live in this process only, forgotten on restart. The conditional claim (cutoff 1)
is what keeps a job from running twice; a duplicate wake-up that another process receives costs one
read of the job's row, which finds it no longer Queued. The records were once shared in the broker's
Redis: that cost every message two Redis round trips (a check and a record), 7% of a worker's time
under load, to spare that one read for the rare copy (a relay that crashed between enqueueing and
marking) that lands on another process.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from dramatiq import Broker, Middleware
from dramatiq.middleware import SkipMessage

from app import logs

log = logs.get(__name__)

#: How long a processed message id is remembered, in seconds. A later copy (a relay retry, a
#: redelivery after a lost ack) normally arrives within minutes; after this the claim still guards.
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
#: How many ids a process remembers at most; the oldest are forgotten first.
DEFAULT_LOCAL_CAPACITY = 100_000


class SeenStore(Protocol):
    def seen(self, message_id: str) -> bool: ...

    def remember(self, message_id: str) -> None: ...


class LocalSeen:
    """Bounded, in this process only, needing neither the broker nor the database. Other processes do
    not see these records."""

    def __init__(self, *, capacity: int = DEFAULT_LOCAL_CAPACITY, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        with self._lock:
            expires = self._seen.get(message_id)
            if expires is None:
                return False
            if expires < self._clock():
                del self._seen[message_id]
                return False
            return True

    def remember(self, message_id: str) -> None:
        with self._lock:
            self._seen[message_id] = self._clock() + self.ttl_seconds
            self._seen.move_to_end(message_id)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)


class Deduplicate(Middleware):
    """Skips a message whose id was already processed. Fails open: if the record cannot be read, the
    message runs, and the claim decides."""

    def __init__(self, store: SeenStore) -> None:
        self.store = store

    def before_process_message(self, broker, message) -> None:
        try:
            seen = self.store.seen(message.message_id)
        except Exception as exc:
            log.warning("dedup.check_failed", message_id=message.message_id, error=type(exc).__name__)
            return
        if seen:
            log.info("dedup.skipped", message_id=message.message_id, actor=message.actor_name)
            raise SkipMessage(f"message {message.message_id} was already processed")

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        if exception is not None:
            return   # a retry comes back under the same id and must run
        try:
            self.store.remember(message.message_id)
        except Exception as exc:
            log.warning("dedup.record_failed", message_id=message.message_id, error=type(exc).__name__)


def for_broker(broker: Broker) -> Deduplicate:
    """The deduplication a consumer of ``broker`` adds: the same on every broker, in this process."""
    return Deduplicate(LocalSeen())
