"""The notifier against a real HTTP receiver on loopback: every event reaches it however it behaves (down,
then slow past the timeout, then up), signed so that it verifies, and a request sent again carries the
same id and the same body. Each request's answer is recorded, retries back off, and a delivery nobody
takes is given up (dead) only past the horizon."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
import pytest

from app.store import cancellation, export, webhooks
from app.store.database import Database
from app.store.types import FailureCode, Role, Status
from app.webhooks import payload, signing
from app.webhooks.client import Poster
from app.webhooks.sender import PassCounts, Sender, SenderConfig, backoff_seconds
from exports_devtools.waiting import wait_until
from exports_devtools.webhook_receiver import WebhookReceiver
from tests.factories import Job, Seeder

SECRET = signing.new_secret()
ENV = {"ACME_HOOK_SECRET": SECRET}
#: Short, so the slow phase times out quickly; retries due almost at once.
CONFIG = SenderConfig(timeout_seconds=0.5, batch_size=20, poll_seconds=0.05, senders=1, backoff_base_seconds=0.05,
                      backoff_max_seconds=0.2, give_up_seconds=3600)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver(SECRET).start()
    yield hook
    hook.release()
    hook.stop()


@pytest.fixture
def notifier_db(db_url) -> Iterator[Database]:
    with Database(db_url, Role.NOTIFIER, max_size=2, name="notifier-under-test") as db:
        yield db


def sender(db: Database, config: SenderConfig = CONFIG, env: dict[str, str] = ENV) -> Sender:
    return Sender(db, config, Poster(timeout_seconds=config.timeout_seconds).post, "test-host:1", dict(env),
                  rng=random.Random(7))


def add_endpoint(conn: psycopg.Connection, tenant: UUID, url: str, secret_ref: str = "env:ACME_HOOK_SECRET") -> UUID:
    endpoint_id = uuid.uuid4()
    assert webhooks.add_endpoint(conn, endpoint_id=endpoint_id, endpoint=webhooks.NewEndpoint(
        tenant_id=tenant, name="prod", url=url, secret_ref=secret_ref, created_by="tests",
        allow_http=True)) is webhooks.AddResult.ADDED
    return endpoint_id


def every_outcome(seed: Seeder, conn: psycopg.Connection, tenant: UUID) -> dict[UUID, str]:
    """One job of the tenant per kind of outcome, each given it by its real writer; job -> status."""
    made: dict[UUID, str] = {}
    for outcome in (Status.COMPLETED, Status.OUTCOME_UNKNOWN):
        job = seed.finished(outcome, seed.queued(tenant))
        made[job.id] = outcome.value
    failed = seed.finished(Status.FAILED, seed.queued(tenant), failure_reason=FailureCode.NOT_DELIVERED)
    made[failed.id] = "Failed"
    stopped = seed.running(seed.queued(tenant))
    cancellation.request_cancellation(conn, tenant_id=tenant, job_id=stopped.id, request_id=uuid.uuid4(),
                                      requested_by="dana")
    assert export.try_finish_stopped(conn, job_id=stopped.id, attempt_id=stopped.attempt_id, worker_id="w",
                                     stop_point="WhileBuilding") == 1
    made[stopped.id] = "Stopped"
    canceled = seed.queued(tenant)
    cancellation.request_cancellation(conn, tenant_id=tenant, job_id=canceled.id, request_id=uuid.uuid4(),
                                      requested_by="dana")
    made[canceled.id] = "Canceled"
    rejected = seed.queued(tenant)
    assert export.reject(conn, job_id=rejected.id, checked_version=1)
    made[rejected.id] = "Rejected"
    return made


def deliveries(admin: psycopg.Connection) -> dict[str, dict]:
    return {str(r["id"]): r for r in admin.execute("SELECT * FROM webhook_deliveries")}


def attempts(admin: psycopg.Connection, delivery_id: str) -> list[dict]:
    return admin.execute("SELECT * FROM webhook_attempts WHERE delivery_id = %s ORDER BY attempt",
                         (delivery_id,)).fetchall()


def pass_until(notifier: Sender, done, what: str, timeout: float = 30.0) -> PassCounts:
    """Passes of the notifier until ``done()``; the counts of them all."""
    total = PassCounts()

    def one() -> bool:
        counts = notifier.run_once()
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(counts, name))
        return bool(done())
    wait_until(one, what, timeout, interval=0.05)
    return total


def test_a_receiver_down_then_slow_then_up_receives_every_event_signed_its_failing_one_first_then_in_order(
        seed, conn, admin, notifier_db, receiver):
    tenant = seed.tenant("Acme")
    add_endpoint(conn, tenant, receiver.url)
    notifier = sender(notifier_db)
    receiver.stop()   # down
    made = every_outcome(seed, conn, tenant)
    ids = set(deliveries(admin))
    assert len(ids) == len(made) == 6

    first = notifier.run_once()

    assert (first.claimed, first.retrying, first.delivered) == (1, 1, 0), "the endpoint's turn: one event"
    (failing,) = [i for i in ids if attempts(admin, i)]
    assert attempts(admin, failing)[0]["error"] == "the connection was refused or failed"
    assert notifier.run_once().claimed == 0, "the endpoint rests until its failing event's retry"

    receiver.mode = "slow"
    receiver.start()
    pass_until(notifier, lambda: len(attempts(admin, failing)) >= 2, "a timed-out try of the failing event")
    assert attempts(admin, failing)[1]["error"] == "no answer within the timeout"
    assert [i for i in ids if attempts(admin, i)] == [failing], "the others wait their turn, never tried"
    receiver.release()
    wait_until(lambda: failing in receiver.by_event(), "the slow answer to be given")

    receiver.mode = "up"
    pass_until(notifier, lambda: all(d["state"] == "delivered" for d in deliveries(admin).values()),
               "every event delivered")

    received = receiver.received()
    assert all(r.verified for r in received), [r.problem for r in received if not r.verified]
    assert receiver.delivered() == ids
    assert len({c.body for c in receiver.by_event()[failing]}) == 1, "a retry sends the same bytes"
    occurred = {str(r["id"]): (r["occurred_at"], str(r["id"])) for r in deliveries(admin).values()}
    first_seen = list(dict.fromkeys(r.event_id for r in received))
    assert first_seen[0] == failing
    assert first_seen[1:] == sorted(ids - {failing}, key=occurred.__getitem__), "then the rest, oldest first"
    bodies = {event_id: copies[0].body for event_id, copies in receiver.by_event().items()}
    told = {payload_of(body)["data"]["export_id"]: payload_of(body)["data"]["status"] for body in bodies.values()}
    assert told == {str(job): status for job, status in made.items()}


def test_a_receiver_that_holds_its_request_holds_one_notifier_thread_and_other_tenants_events_keep_flowing(
        seed, conn, admin, notifier_db, receiver):
    fast = WebhookReceiver(SECRET).start()
    try:
        stuck, flowing = seed.tenant("Stuck"), seed.tenant("Flowing")
        add_endpoint(conn, stuck, receiver.url)
        add_endpoint(conn, flowing, fast.url)
        receiver.mode = "slow"   # takes a request and answers nothing until released
        for tenant in (stuck, flowing):   # the stuck tenant's events are older: first in line
            for _ in range(4):
                seed.finished(Status.COMPLETED, seed.queued(tenant))
        theirs = {str(r["id"]) for r in deliveries(admin).values() if r["tenant_id"] == flowing}
        patient = SenderConfig(timeout_seconds=30, batch_size=20, poll_seconds=0.05, senders=2)
        stop = threading.Event()
        running = threading.Thread(target=sender(notifier_db, patient).run_forever, args=(stop,), daemon=True)
        running.start()
        try:
            wait_until(lambda: fast.delivered() == theirs, "the other tenant's events delivered")
            held = receiver.arrived()
        finally:
            stop.set()
            receiver.release()
            running.join(60)
    finally:
        fast.stop()

    assert len(held) == 1, "one request at a time to the stuck endpoint, however many senders"
    untried = [r for r in deliveries(admin).values() if r["tenant_id"] == stuck and str(r["id"]) != held[0]]
    assert [r["attempts"] for r in untried] == [0, 0, 0]


def payload_of(body: bytes) -> dict:
    return json.loads(body)


def test_a_completed_export_s_event_carries_its_file_and_attempt(seed, conn, admin, notifier_db, receiver):
    tenant = seed.tenant("Acme")
    add_endpoint(conn, tenant, receiver.url)
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))

    assert sender(notifier_db).run_once().delivered == 1

    (request,) = receiver.received()
    event = payload_of(request.body)
    row = seed.row(job)
    assert event["type"] == "export.completed"
    assert event["data"] == {
        "event_id": request.event_id, "export_id": str(job.id), "tenant_id": str(tenant),
        "delivery_key": job.delivery_key, "status": "Completed", "failure_reason": None, "recorded_by": "worker",
        "file_name": export.final_name(job.delivery_key), "bytes": row["expected_file_bytes"],
        "sha256": bytes(row["expected_file_sha256"]).hex(), "attempt_id": str(job.attempt_id), "attempt_number": 1,
        "replaces_export_id": None, "schedule_id": None, "slot": None, "occurred_at": event["timestamp"]}
    assert request.headers["webhook-id"] == request.event_id == str(deliveries(admin).popitem()[1]["id"])


def test_a_delivery_nobody_takes_is_retried_with_backoff_then_dead_past_the_horizon(seed, conn, admin, notifier_db,
                                                                                    receiver):
    tenant = seed.tenant("Acme")
    add_endpoint(conn, tenant, receiver.url)
    receiver.stop()
    job = seed.running(seed.queued(tenant))
    export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                             failure_reason=FailureCode.BUILD_FAILED)
    # Two seconds of horizon: the tries fall inside it, and the last one's backoff would end past it.
    notifier = sender(notifier_db, SenderConfig(timeout_seconds=0.5, batch_size=5, poll_seconds=0.05, senders=1,
                                                backoff_base_seconds=0.1, backoff_max_seconds=0.4,
                                                give_up_seconds=2))

    counts = pass_until(notifier, lambda: next(iter(deliveries(admin).values()))["state"] == "dead",
                        "the delivery to be given up")

    (delivery,) = deliveries(admin).values()
    tries = attempts(admin, str(delivery["id"]))
    assert counts.dead == 1 and counts.retrying == len(tries) - 1 >= 2
    assert [t["attempt"] for t in tries] == list(range(1, len(tries) + 1))
    gaps = [(b["started_at"] - a["finished_at"]).total_seconds() for a, b in zip(tries, tries[1:], strict=False)]
    assert all(gap >= 0.05 for gap in gaps), gaps   # at least half the first backoff, every time
    # Given up only once the next try would fall past the horizon: never before the horizon less one backoff.
    assert (delivery["finished_at"] - delivery["occurred_at"]).total_seconds() >= 2 - 0.4
    assert notifier.run_once().claimed == 0, "a dead delivery is never claimed again"


def test_the_backoff_doubles_from_its_base_up_to_its_cap_within_its_jitter():
    config = SenderConfig(backoff_base_seconds=10, backoff_max_seconds=300)
    rng = random.Random(3)

    for attempt, ceiling in ((1, 10), (2, 20), (3, 40), (5, 160), (6, 300), (40, 300)):
        waits = [backoff_seconds(attempt, config, rng) for _ in range(50)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > ceiling / 10, "jittered"


def test_two_notifiers_claim_disjoint_batches_and_each_event_is_sent_once(seed, conn, admin, db_url, receiver):
    for n in range(6):   # six endpoints, one event each: an endpoint has one turn per batch
        tenant = seed.tenant(f"Acme {n}")
        add_endpoint(conn, tenant, receiver.url)
        job = seed.running(seed.queued(tenant))
        export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                                 failure_reason=FailureCode.BUILD_FAILED)
    config = SenderConfig(timeout_seconds=5, batch_size=3, poll_seconds=0.05, senders=1)
    with (Database(db_url, Role.NOTIFIER, max_size=2) as one, Database(db_url, Role.NOTIFIER, max_size=2) as two,
          one.connection() as a, two.connection() as b):
        first = webhooks.claim_batch(a, batch_size=3, lease_seconds=config.lease_seconds)
        second = webhooks.claim_batch(b, batch_size=3, lease_seconds=config.lease_seconds)
        third = webhooks.claim_batch(a, batch_size=3, lease_seconds=config.lease_seconds)

    assert len(first) == len(second) == 3 and third == []
    assert not {d.id for d in first} & {d.id for d in second}


def test_a_notifier_that_died_mid_send_leaves_the_delivery_to_be_sent_again_under_its_id(seed, conn, admin,
                                                                                         notifier_db, receiver):
    tenant = seed.tenant("Acme")
    add_endpoint(conn, tenant, receiver.url)
    job = seed.finished(Status.COMPLETED, seed.queued(tenant))
    with notifier_db.connection() as c:
        (claimed,) = webhooks.claim_batch(c, batch_size=5, lease_seconds=60)   # then it died
    assert sender(notifier_db).run_once().claimed == 0, "leased: nobody sends it meanwhile"
    admin.execute("UPDATE webhook_deliveries SET next_attempt_at = clock_timestamp() - interval '1 s'")   # lease ends

    counts = sender(notifier_db).run_once()

    assert counts.delivered == 1
    assert [r.event_id for r in receiver.received()] == [str(claimed.id)]
    assert [(a["attempt"], a["http_status"]) for a in attempts(admin, str(claimed.id))] == [(2, 204)]
    assert seed.row(job)["status"] == "Completed"


def test_a_late_answer_to_an_earlier_claim_is_recorded_and_leaves_the_delivery_to_its_new_claim(seed, conn, admin,
                                                                                                notifier_db):
    tenant = seed.tenant("Acme")
    add_endpoint(conn, tenant, "http://127.0.0.1:9/never")
    seed.finished(Status.COMPLETED, seed.queued(tenant))
    with notifier_db.connection() as c:
        (old,) = webhooks.claim_batch(c, batch_size=5, lease_seconds=0)
        (new,) = webhooks.claim_batch(c, batch_size=5, lease_seconds=60)
        late = webhooks.record_attempt(c, delivery_id=old.id, attempt=old.attempt, sender="a",
                                       started_at=old.occurred_at, http_status=503, error="HTTP 503", delivered=False,
                                       retry_in_seconds=1, give_up_seconds=3600)
        current = webhooks.record_attempt(c, delivery_id=new.id, attempt=new.attempt, sender="b",
                                          started_at=new.occurred_at, http_status=204, error=None, delivered=True,
                                          retry_in_seconds=1, give_up_seconds=3600)

    assert (old.attempt, new.attempt) == (1, 2)
    assert late is None and current is webhooks.DeliveryState.DELIVERED
    assert [(a["attempt"], a["http_status"]) for a in attempts(admin, str(new.id))] == [(1, 503), (2, 204)]


def test_a_missing_secret_is_recorded_as_the_reason_and_retried_never_sent_unsigned(seed, conn, admin, notifier_db,
                                                                                   receiver):
    tenant = seed.tenant("Acme")
    add_endpoint(conn, tenant, receiver.url, secret_ref="env:NOT_SET_HERE")
    seed.finished(Status.COMPLETED, seed.queued(tenant))

    counts = sender(notifier_db).run_once()

    (delivery,) = deliveries(admin).values()
    (tried,) = attempts(admin, str(delivery["id"]))
    assert counts.retrying == 1 and receiver.received() == []
    assert tried["http_status"] is None
    assert tried["error"] == "signing secret unavailable: environment variable NOT_SET_HERE is not set in this process"


def test_what_a_removed_endpoint_was_owed_is_dropped_not_sent(seed, conn, admin, notifier_db, receiver):
    tenant = seed.tenant("Acme")
    endpoint = add_endpoint(conn, tenant, receiver.url)
    job: Job = seed.finished(Status.COMPLETED, seed.queued(tenant))
    assert webhooks.remove_endpoint(conn, tenant_id=tenant, endpoint_id=endpoint, removed_by="dana")

    counts = sender(notifier_db).run_once()

    assert (counts.claimed, counts.dropped) == (1, 1)
    assert receiver.received() == []
    assert [(d["state"], d["attempts"]) for d in deliveries(admin).values()] == [("dropped", 0)]
    assert seed.row(job)["status"] == "Completed"


def test_the_probe_body_is_its_own_type_and_no_export_s():
    sent = payload.probe(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "prod", datetime.now(UTC))

    assert payload_of(sent)["type"] == "webhook.test"


def test_a_stopping_notifier_hands_back_what_it_claimed_and_did_not_send(seed, conn, admin, notifier_db, receiver):
    for n in range(3):
        tenant = seed.tenant(f"Acme {n}")
        add_endpoint(conn, tenant, receiver.url)
        seed.finished(Status.COMPLETED, seed.queued(tenant))
    stopping = threading.Event()
    stopping.set()

    counts = sender(notifier_db).run_once(stopping)

    assert (counts.claimed, counts.released, counts.delivered) == (3, 3, 0)
    assert receiver.received() == []
    assert {(d["state"], d["attempts"]) for d in deliveries(admin).values()} == {("pending", 0)}
    assert sender(notifier_db).run_once().delivered == 3, "due again at once, not after the lease"


def _given_up(seed: Seeder, conn: psycopg.Connection, admin: psycopg.Connection, notifier_db: Database,
              receiver: WebhookReceiver) -> tuple[UUID, UUID, dict]:
    """An endpoint of Acme whose one event the notifier gave up on (the receiver down past a 1 s horizon);
    the tenant, the endpoint and the dead delivery."""
    tenant = seed.tenant("Acme")
    endpoint = add_endpoint(conn, tenant, receiver.url)
    receiver.stop()
    job = seed.running(seed.queued(tenant))
    export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                             failure_reason=FailureCode.BUILD_FAILED)
    quick = SenderConfig(timeout_seconds=0.5, batch_size=5, poll_seconds=0.05, senders=1, backoff_base_seconds=0.1,
                         backoff_max_seconds=0.2, give_up_seconds=1)
    pass_until(sender(notifier_db, quick), lambda: next(iter(deliveries(admin).values()))["state"] == "dead",
               "the delivery to be given up")
    (dead,) = deliveries(admin).values()
    return tenant, endpoint, dead


def test_a_given_up_event_redelivered_by_an_operator_reaches_the_receiver_under_its_id_once(
        seed, conn, admin, notifier_db, receiver):
    tenant, endpoint, dead = _given_up(seed, conn, admin, notifier_db, receiver)
    assert webhooks.dead_deliveries(conn, tenant_id=tenant, endpoint_id=endpoint, since=None)[0].id == dead["id"]

    revived = webhooks.redeliver(conn, tenant_id=tenant, endpoint_id=endpoint, since=None, revived_by="dana")
    again = webhooks.redeliver(conn, tenant_id=tenant, endpoint_id=endpoint, since=None, revived_by="erin")

    assert [r.id for r in revived] == [dead["id"]] and again == []   # only a dead delivery is revived
    row = deliveries(admin)[str(dead["id"])]
    assert (row["state"], row["finished_at"], row["revived_by"]) == ("pending", None, "dana")
    receiver.start()
    notifier = sender(notifier_db)   # a horizon of an hour, counted from the redelivery
    pass_until(notifier, lambda: deliveries(admin)[str(dead["id"])]["state"] == "delivered", "the redelivery")
    (got,) = receiver.received()
    assert got.headers["webhook-id"] == str(dead["id"]) and got.verified
    assert webhooks.dead_deliveries(conn, tenant_id=tenant, endpoint_id=endpoint, since=None) == []


def test_a_redelivered_event_is_given_up_again_only_past_a_horizon_counted_from_its_redelivery(
        seed, conn, admin, notifier_db, receiver):
    tenant, endpoint, dead = _given_up(seed, conn, admin, notifier_db, receiver)
    # Its outcome older than the horizon below: counted from the outcome, the next failure would give it up
    # at once; counted from the redelivery, it is retried.
    wait_until(lambda: admin.execute("SELECT clock_timestamp() - occurred_at > interval '6 seconds' AS old "
                                     "FROM webhook_deliveries WHERE id = %s", (dead["id"],)).fetchone()["old"],
               "the event to be six seconds old", timeout=30)
    webhooks.redeliver(conn, tenant_id=tenant, endpoint_id=endpoint, since=None, revived_by="dana")
    notifier = sender(notifier_db, SenderConfig(timeout_seconds=0.5, batch_size=5, poll_seconds=0.05, senders=1,
                                                backoff_base_seconds=0.05, backoff_max_seconds=0.1,
                                                give_up_seconds=4))
    counts = notifier.run_once()   # the receiver is still down: one more try, and pending again

    row = deliveries(admin)[str(dead["id"])]
    assert counts.retrying == 1 and counts.dead == 0 and row["state"] == "pending"


def test_redeliver_leaves_a_removed_endpoint_s_events_and_those_before_since_alone(
        seed, conn, admin, notifier_db, receiver):
    tenant, endpoint, dead = _given_up(seed, conn, admin, notifier_db, receiver)
    later = dead["occurred_at"] + timedelta(seconds=1)

    assert webhooks.dead_deliveries(conn, tenant_id=tenant, endpoint_id=endpoint, since=later) == []
    assert webhooks.redeliver(conn, tenant_id=tenant, endpoint_id=endpoint, since=later, revived_by="dana") == []
    assert webhooks.remove_endpoint(conn, tenant_id=tenant, endpoint_id=endpoint, removed_by="dana")
    assert webhooks.redeliver(conn, tenant_id=tenant, endpoint_id=endpoint, since=None, revived_by="dana") == []
    assert deliveries(admin)[str(dead["id"])]["state"] == "dead"
