"""Deduplication of wake-up messages by message id.

Dramatiq's Redis broker does not deduplicate: the same ``message_id`` enqueued twice runs twice. This
middleware records a message id once its processing returned normally, and skips (and so acks) a copy
that arrives later. A message whose processing raised is not recorded, because Dramatiq's retry
enqueues it again under the same id and that retry must run.

This is an optimisation, not the guard: two copies processed at the same time both pass, a record can
expire or be lost, and the in-process fallback forgets on restart. The conditional claim (cutoff 1)
is what keeps a job from running twice; a duplicate wake-up only repeats a side-effect-free policy
evaluation before its claim matches nothing.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Protocol

import redis
from dramatiq import Broker, Middleware
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import SkipMessage

from app import logs

log = logs.get(__name__)

#: How long a processed message id is remembered, in seconds. A later copy (a relay retry, a
#: redelivery after a lost ack) normally arrives within minutes; after this the claim still guards.
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
#: How many ids the in-process fallback remembers at most; the oldest are forgotten first.
DEFAULT_LOCAL_CAPACITY = 100_000
KEY_PREFIX = "exports:done:"


class SeenStore(Protocol):
    def seen(self, message_id: str) -> bool: ...

    def remember(self, message_id: str) -> None: ...


class RedisSeen:
    """Shared by every worker on the broker's Redis, with a TTL per id."""

    def __init__(self, client: redis.Redis, *, ttl_seconds: int = DEFAULT_TTL_SECONDS) -> None:
        self.client = client
        self.ttl_seconds = ttl_seconds

    def seen(self, message_id: str) -> bool:
        return bool(self.client.exists(KEY_PREFIX + message_id))

    def remember(self, message_id: str) -> None:
        self.client.set(KEY_PREFIX + message_id, b"1", ex=self.ttl_seconds)


class LocalSeen:
    """Bounded, in this process only, needing no database: the fallback when the broker is not Redis
    (RabbitMQ has nowhere cheap to keep it). Other processes do not see these records."""

    def __init__(self, *, capacity: int = DEFAULT_LOCAL_CAPACITY, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        self.capacity = capacity
        self.ttl_seconds = ttl_seconds
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        with self._lock:
            expires = self._seen.get(message_id)
            if expires is None:
                return False
            if expires < time.monotonic():
                del self._seen[message_id]
                return False
            return True

    def remember(self, message_id: str) -> None:
        with self._lock:
            self._seen[message_id] = time.monotonic() + self.ttl_seconds
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
    """The deduplication a consumer of ``broker`` adds: records shared in the broker's own Redis, else
    (RabbitMQ) the bounded in-process fallback."""
    if isinstance(broker, RedisBroker):
        return Deduplicate(RedisSeen(broker.client))
    return Deduplicate(LocalSeen())
