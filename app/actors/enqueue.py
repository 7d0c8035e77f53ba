"""Enqueueing a batch of messages in one round trip.

Dramatiq's ``RedisBroker.enqueue`` runs its Lua dispatch script once per message: one round trip each,
most of the relay's time. ``enqueue_batch`` sends a batch's scripts down one Redis pipeline (not a
transaction: each message stands alone) and answers, per message, whether Redis ran it, so the relay
marks published exactly the rows the broker took. Any other broker enqueues one message at a time and
stops at the first refusal (RabbitMQ's publisher confirms answer per message anyway).

The pipeline calls the same dispatch script with the same arguments ``RedisBroker.enqueue`` would
(dramatiq 2.x, pinned by constraints.txt), and emits the same middleware hooks around each message.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import uuid4

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis


def enqueue_batch(broker: dramatiq.Broker, messages: Sequence[dramatiq.Message]) -> list[BaseException | None]:
    """Per message, None when the broker took it, else the error; nothing after a refusal is sent by a
    broker without pipelining (its later entries repeat that error)."""
    if isinstance(broker, RedisBroker):
        return _pipelined(broker, messages)
    results: list[BaseException | None] = []
    for message in messages:
        try:
            broker.enqueue(message)
        except Exception as exc:
            return results + [exc] * (len(messages) - len(results))
        results.append(None)
    return results


def _pipelined(broker: RedisBroker, messages: Sequence[dramatiq.Message]) -> list[BaseException | None]:
    # Each copy gets its own id in Redis, as RedisBroker.enqueue gives it: a retried message must not
    # collide with its earlier self.
    prepared = [m.copy(options={"redis_message_id": str(uuid4())}) for m in messages]
    for message in prepared:
        broker.emit_before("enqueue", message, None)
    dispatch = broker.scripts["dispatch"]
    try:
        with broker.client.pipeline(transaction=False) as pipe:
            for message in prepared:
                dispatch(keys=[broker.namespace], client=pipe, args=[
                    "enqueue", current_millis(), message.queue_name, broker.broker_id, broker.heartbeat_timeout,
                    broker.dead_message_ttl, broker._should_do_maintenance("enqueue"), broker._max_unpack_size(),
                    message.options["redis_message_id"], message.encode()])
            replies = pipe.execute(raise_on_error=False)
    except Exception as exc:
        # The connection failed: no reply says which scripts ran, so none counts as taken. A script that
        # did run is republished later under the same message id, and the worker's dedup absorbs it.
        return [exc] * len(prepared)
    results: list[BaseException | None] = []
    for message, reply in zip(prepared, replies, strict=True):
        if isinstance(reply, Exception):
            results.append(reply)
        else:
            broker.emit_after("enqueue", message, None)
            results.append(None)
    return results
