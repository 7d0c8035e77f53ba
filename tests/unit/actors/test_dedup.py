"""The deduplication store: a processed message id is remembered for its TTL and a second copy is
skipped; the middleware fails open, so an unreadable record lets the message run and the conditional
claim decide. Records live in the worker process: sharing them in Redis cost two round trips per
message to spare one read of the row for a rare copy (app/actors/dedup.py)."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from app.actors.dedup import DEFAULT_TTL_SECONDS, Deduplicate, LocalSeen, for_broker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _message(message_id: str) -> dramatiq.Message:
    return dramatiq.Message(queue_name="exports", actor_name="export_ready", args=("job",), kwargs={}, options={},
                            message_id=message_id)


def test_a_processed_message_id_is_remembered_until_its_ttl_has_passed():
    clock = Clock()
    seen = LocalSeen(clock=clock)
    seen.remember("m-1")

    clock.now += DEFAULT_TTL_SECONDS - 1
    assert seen.seen("m-1") is True
    clock.now += 2
    assert seen.seen("m-1") is False


def test_a_record_expires_after_its_ttl_and_is_forgotten():
    clock = Clock()
    seen = LocalSeen(ttl_seconds=60, clock=clock)
    seen.remember("m-1")

    clock.now += 61   # what the clock does after a minute

    assert seen.seen("m-1") is False
    assert seen.seen("m-1") is False   # and stays forgotten


def test_a_second_copy_of_a_processed_message_is_skipped_and_a_new_id_runs():
    middleware = Deduplicate(LocalSeen())
    first = _message("outbox-1")
    middleware.before_process_message(None, first)
    middleware.after_process_message(None, first, result=None)

    with pytest.raises(SkipMessage):
        middleware.before_process_message(None, _message("outbox-1"))
    middleware.before_process_message(None, _message("outbox-2"))   # another wake-up: no exception


def test_a_message_whose_processing_raised_is_not_remembered_so_its_retry_runs():
    middleware = Deduplicate(LocalSeen())
    failed = _message("outbox-1")
    middleware.before_process_message(None, failed)
    middleware.after_process_message(None, failed, exception=RuntimeError("claim unknown"))

    middleware.before_process_message(None, _message("outbox-1"))   # the retry runs


class _Unreadable:
    def seen(self, message_id: str) -> bool:
        raise OSError("the store is gone")

    def remember(self, message_id: str) -> None:
        raise OSError("the store is gone")


def test_an_unreadable_record_fails_open_and_the_message_runs():
    middleware = Deduplicate(_Unreadable())
    message = _message("outbox-1")

    middleware.before_process_message(None, message)   # no SkipMessage: the claim decides
    middleware.after_process_message(None, message, result=None)   # a failed record is logged, not raised


def test_a_redis_broker_s_consumer_keeps_its_records_in_the_process_and_sends_redis_nothing(monkeypatch):
    import redis
    from dramatiq.brokers.redis import RedisBroker

    client = redis.Redis(host="127.0.0.1", port=1)   # nothing listens there: a command would fail
    commands: list[tuple] = []
    monkeypatch.setattr(client, "execute_command", lambda *args, **kwargs: commands.append(args))
    middleware = for_broker(RedisBroker(client=client))
    message = _message("outbox-1")

    middleware.before_process_message(None, message)
    middleware.after_process_message(None, message, result=None)

    assert isinstance(middleware.store, LocalSeen) and commands == []
    with pytest.raises(SkipMessage):
        middleware.before_process_message(None, _message("outbox-1"))
