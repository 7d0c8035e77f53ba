"""The export actor's settlement rules on Dramatiq's StubBroker: which outcomes settle the message,
which one leaves it for redelivery, and how copies of one message id are absorbed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from app import logs, relay
from app.actors import export
from app.actors.dedup import Deduplicate, LocalSeen
from app.actors.runner import RunOutcome, RunResult
from app.store.relay import OutboxMessage


class ScriptedRun:
    """Answers each call with the next outcome of a script, and records the job ids it was given."""

    def __init__(self, *outcomes: RunOutcome) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[UUID] = []
        self.lock = threading.Lock()

    def __call__(self, job_id: UUID) -> RunResult:
        with self.lock:
            self.calls.append(job_id)
            outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        return RunResult(outcome)


@pytest.fixture
def broker():
    broker = StubBroker()
    broker.add_middleware(Deduplicate(LocalSeen()))
    broker.emit_after("process_boot")
    yield broker
    broker.close()


@pytest.fixture
def worker(broker):
    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    yield worker
    worker.stop()


def _message(job_id: UUID, message_id: str | None = None) -> dramatiq.Message:
    return dramatiq.Message(queue_name=export.QUEUE, actor_name=export.ACTOR_NAME, args=(str(job_id),), kwargs={},
                            options={}, message_id=message_id or str(uuid.uuid4()))


def test_the_export_actor_has_no_time_limit_and_bounded_retries_with_backoff(broker):
    actor = export.declare(broker, ScriptedRun(RunOutcome.DELIVERED))

    assert actor.options["time_limit"] == float("inf")   # never an async exception mid-upload
    assert actor.options["max_retries"] == export.MAX_RETRIES == 10
    assert (actor.options["min_backoff"], actor.options["max_backoff"]) == (1_000, 60_000)
    assert (actor.actor_name, actor.queue_name) == (relay.EXPORT_ACTOR, relay.EXPORT_QUEUE)


@pytest.mark.parametrize("url, broker_class", [
    ("redis://127.0.0.1:1/0", "WakingRedisBroker"),    # unreachable on purpose: nothing may connect at import
    ("amqp://guest:guest@127.0.0.1:1/%2F", "RabbitmqBroker"),
    ("", "WakingRedisBroker"),                         # the embedded Redis, started on first use only
])
def test_importing_the_worker_entry_point_installs_the_broker_from_the_environment_and_declares_the_actor(
        tmp_path, url, broker_class):
    # A fresh interpreter, as a worker process is: the package is imported before anything else.
    probe = (
        "import dramatiq, app.worker\n"
        "from app.actors.dedup import Deduplicate\n"
        "b = dramatiq.get_broker()\n"
        "assert b.get_actor('export_ready') is app.worker.export_ready\n"
        "assert any(isinstance(m, Deduplicate) for m in b.middleware)\n"
        "print(type(b).__name__)\n")
    env = {**os.environ, "EXPORTS_BROKER_URL": url, "EXPORTS_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == broker_class
    assert not (tmp_path / "redis.db.settings").exists()   # no embedded server was started


def test_a_message_built_by_the_relay_runs_the_actor_with_its_job_id(broker, worker):
    run = ScriptedRun(RunOutcome.DELIVERED)
    export.declare(broker, run)
    row = OutboxMessage(uuid.uuid4(), relay.EXPORT_READY, uuid.uuid4(), datetime.now(UTC))
    message = relay.message_for(row)

    broker.enqueue(message)
    broker.join(export.QUEUE)
    worker.join()

    assert run.calls == [row.job_id] and message.message_id == str(row.message_id)


@pytest.mark.parametrize("outcome", [o for o in RunOutcome if o is not RunOutcome.CLAIM_UNKNOWN])
def test_every_outcome_but_an_unknown_claim_settles_the_message_after_one_run(broker, worker, outcome):
    run = ScriptedRun(outcome)
    export.declare(broker, run, min_backoff=1, max_backoff=1)

    broker.enqueue(_message(uuid.uuid4()))
    broker.join(export.QUEUE)
    worker.join()

    assert len(run.calls) == 1
    assert broker.dead_letters == []


def test_a_claim_left_unknown_leaves_the_message_unsettled_and_it_is_delivered_again(broker, worker):
    job_id = uuid.uuid4()
    run = ScriptedRun(RunOutcome.CLAIM_UNKNOWN, RunOutcome.CLAIM_UNKNOWN, RunOutcome.DELIVERED)
    export.declare(broker, run, min_backoff=1, max_backoff=1)

    # The retry comes back under the same message id: deduplication must let it through.
    broker.enqueue(_message(job_id, "outbox-1"))
    broker.join(export.QUEUE)
    worker.join()

    assert run.calls == [job_id, job_id, job_id]
    assert broker.dead_letters == []


def test_a_claim_that_stays_unknown_is_dead_lettered_after_the_retries(broker, worker):
    run = ScriptedRun(RunOutcome.CLAIM_UNKNOWN)
    export.declare(broker, run, min_backoff=1, max_backoff=1, max_retries=2)

    broker.enqueue(_message(uuid.uuid4()))
    broker.join(export.QUEUE, fail_fast=False)
    worker.join()

    assert len(run.calls) == 3
    assert len(broker.dead_letters) == 1


def test_a_message_id_processed_once_is_skipped_when_a_copy_arrives_later(broker, worker):
    job_id = uuid.uuid4()
    run = ScriptedRun(RunOutcome.DELIVERED)
    export.declare(broker, run)

    broker.enqueue(_message(job_id, "outbox-1"))
    broker.join(export.QUEUE)
    worker.join()
    broker.enqueue(_message(job_id, "outbox-1"))   # the relay published the same outbox row again
    broker.enqueue(_message(job_id, "outbox-2"))   # a new wake-up (a sweep, a requeue) is another id
    broker.join(export.QUEUE)
    worker.join()

    assert run.calls == [job_id, job_id]


def test_the_local_record_forgets_the_oldest_ids_beyond_its_capacity():
    seen = LocalSeen(capacity=2)
    for message_id in ("a", "b", "c"):
        seen.remember(message_id)

    assert [seen.seen(m) for m in ("a", "b", "c", "d")] == [False, True, True, False]


def test_every_line_about_a_wake_up_carries_its_message_id_and_job_id_and_the_next_message_starts_clean():
    broker = StubBroker()
    broker.add_middleware(export.BindMessage(), before=type(broker.middleware[0]))
    broker.add_middleware(Deduplicate(LocalSeen()))
    broker.emit_after("process_boot")
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    seen: list[dict] = []

    def run(job_id: UUID) -> RunResult:
        seen.append(dict(logs.current()))
        return RunResult(RunOutcome.DELIVERED)

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append   # type: ignore[method-assign]
    handler.addFilter(logs.BindingFilter())
    dedup_log = logging.getLogger("app.actors.dedup")
    dedup_log.addHandler(handler)
    level = dedup_log.level
    dedup_log.setLevel(logging.INFO)
    try:
        export.declare(broker, run)
        first, second = uuid.uuid4(), uuid.uuid4()
        broker.enqueue(_message(first, "outbox-1"))
        broker.join(export.QUEUE)
        worker.join()
        broker.enqueue(_message(first, "outbox-1"))   # a copy: skipped by the deduplication
        broker.enqueue(_message(second, "outbox-2"))
        broker.join(export.QUEUE)
        worker.join()
    finally:
        dedup_log.removeHandler(handler)
        dedup_log.setLevel(level)
        worker.stop()
        broker.close()

    assert seen == [{"message_id": "outbox-1", "job_id": str(first)}, {"message_id": "outbox-2", "job_id": str(second)}]
    [skipped] = [r for r in records if r.getMessage() == "dedup.skipped"]
    assert logs.fields_of(skipped) == {"message_id": "outbox-1", "job_id": str(first), "actor": export.ACTOR_NAME}
