"""The deduplication store on a server-less Redis (fakeredis): a processed message id is remembered with
a TTL and a second copy is skipped; the store fails open, so an unreadable record lets the message run
and the conditional claim decide. Tests that need Redis's real Lua and blocking semantics (the broker
itself) run against a real Redis elsewhere."""

from __future__ import annotations

import dramatiq
import fakeredis
import pytest
import redis
from dramatiq.middleware import SkipMessage

from app.actors.dedup import DEFAULT_TTL_SECONDS, KEY_PREFIX, Deduplicate, RedisSeen


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def _message(message_id: str) -> dramatiq.Message:
    return dramatiq.Message(queue_name="exports", actor_name="export_ready", args=("job",), kwargs={}, options={},
                            message_id=message_id)


def test_a_processed_message_id_is_remembered_with_its_ttl(client):
    RedisSeen(client).remember("m-1")

    assert client.exists(KEY_PREFIX + "m-1") == 1
    assert 0 < client.ttl(KEY_PREFIX + "m-1") <= DEFAULT_TTL_SECONDS


def test_a_record_expires_after_its_ttl(client):
    seen = RedisSeen(client, ttl_seconds=60)
    seen.remember("m-1")

    client.expire(KEY_PREFIX + "m-1", 0)   # what the clock would do after a minute

    assert seen.seen("m-1") is False


def test_a_second_copy_of_a_processed_message_is_skipped_and_a_new_id_runs(client):
    middleware = Deduplicate(RedisSeen(client))
    first = _message("outbox-1")
    middleware.before_process_message(None, first)
    middleware.after_process_message(None, first, result=None)

    with pytest.raises(SkipMessage):
        middleware.before_process_message(None, _message("outbox-1"))
    middleware.before_process_message(None, _message("outbox-2"))   # another wake-up: no exception


def test_a_message_whose_processing_raised_is_not_remembered_so_its_retry_runs(client):
    middleware = Deduplicate(RedisSeen(client))
    failed = _message("outbox-1")
    middleware.before_process_message(None, failed)
    middleware.after_process_message(None, failed, exception=RuntimeError("claim unknown"))

    middleware.before_process_message(None, _message("outbox-1"))   # the retry runs


class _Unreachable(fakeredis.FakeRedis):
    def exists(self, *names):
        raise redis.ConnectionError("Redis is down")

    def set(self, *args, **kwargs):
        raise redis.ConnectionError("Redis is down")


def test_an_unreadable_record_fails_open_and_the_message_runs():
    middleware = Deduplicate(RedisSeen(_Unreachable()))
    message = _message("outbox-1")

    middleware.before_process_message(None, message)   # no SkipMessage: the claim decides
    middleware.after_process_message(None, message, result=None)   # a failed record is logged, not raised
