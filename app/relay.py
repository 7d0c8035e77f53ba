"""The relay: publishes unpublished outbox rows to Dramatiq, as the dispatcher role.

One pass is one short transaction: lock a batch of unpublished rows (``FOR UPDATE SKIP LOCKED``, so
any number of relays can run at once and never publish one row twice in a pass), enqueue them as
messages for the export actor whose Dramatiq ``message_id`` is the row's ``message_id`` (on Redis in
one pipelined round trip: ``enqueue_batch``), mark the ones the broker took published, commit.

The only way a message is published twice is a crash (or a lost commit) after the broker took the
message and before the mark committed, an ``enqueue`` whose reply was lost included: the row is still
unpublished, so the next pass enqueues it again with the same message id, and the worker's
deduplication middleware absorbs the copy. A broker
outage (``enqueue`` raises) leaves that row and every later one unpublished and unmarked for the next
pass; nothing is lost and nothing is marked that the broker did not take.

Only rows that are due are published: a deferral writes its wake-up due after a backoff, and the
relay leaves it until then. ``run_forever`` waits on ``LISTEN exports_outbox`` (the outbox insert
trigger notifies it) with a polling fallback, never longer than until the next row falls due, and
drains in batches until a batch comes back short.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import dramatiq
import psycopg
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from redis.exceptions import NoScriptError

from app import logs, metrics
from app.broker import build_broker, wake_channel
from app.config import ConfigError, Settings
from app.heartbeat import Heartbeat
from app.store import connector, errors
from app.store.database import Database, connect
from app.store.relay import OutboxMessage, claim_batch, mark_published
from app.store.types import Role

if TYPE_CHECKING:
    from dramatiq import Broker

log = logs.get(__name__)

#: The Dramatiq queue and actor the relay publishes to; they must match ``app/actors/export.py``.
EXPORT_QUEUE = "exports"
EXPORT_ACTOR = "export_ready"
#: The outbox kind the export actor handles; the only kind any statement writes.
EXPORT_READY = "ExportReady"
#: The channel the outbox insert trigger notifies.
OUTBOX_CHANNEL = "exports_outbox"
#: Longest single wait for a notification, in seconds, so a stop request is noticed promptly.
STOP_CHECK_SECONDS = 0.5
#: Shortest wait for a row falling due, in seconds.
DUE_WAIT_FLOOR_SECONDS = 0.05
#: Seconds to wait after a pass or a listener failed (database unreachable) before trying again.
FAILURE_BACKOFF_SECONDS = 2.0


@dataclass(frozen=True)
class RelayPass:
    """What one pass did: rows locked, rows enqueued and marked, and whether the broker refused one; and
    the seconds until the next row it left falls due (None: none waits)."""

    claimed: int
    published: int
    broker_failed: bool
    #: The most rows the pass could take.
    batch_size: int
    next_due_seconds: float | None = None

    @property
    def drained(self) -> bool:
        """True when another pass right now would find nothing this one could have taken: a short batch
        took every due row it could lock (a row committed since wakes the relay by its notification)."""
        return self.broker_failed or self.published < self.claimed or self.claimed < self.batch_size


def _age_seconds(due: datetime) -> float:
    return max(0.0, (datetime.now(UTC) - due).total_seconds())


def message_for(row: OutboxMessage, *, queue_name: str = EXPORT_QUEUE) -> dramatiq.Message:
    """The export actor's message for an outbox row. ``actor.send()`` would mint its own id; the
    outbox id is the one the worker deduplicates on, so the message is built by hand."""
    return dramatiq.Message(
        queue_name=queue_name,
        actor_name=EXPORT_ACTOR,
        args=(str(row.job_id),),
        kwargs={},
        options={},
        message_id=str(row.message_id),
    )


def enqueue_batch(broker: dramatiq.Broker, messages: Sequence[dramatiq.Message]) -> list[BaseException | None]:
    """Enqueues ``messages``; per message, None when the broker took it, else the error.

    Dramatiq's ``RedisBroker.enqueue`` runs its Lua dispatch script once per message: one round trip
    each, most of the relay's time. On Redis the batch's scripts go down one pipeline (not a
    transaction: each message stands alone), with the arguments ``RedisBroker.enqueue`` would pass
    (dramatiq 2.x, pinned by constraints.txt) and the same middleware hooks around each message, and
    each reply says whether Redis ran its script, so the relay marks published exactly the rows the
    broker took. Any other broker enqueues one message at a time and stops at the first refusal (its
    later entries repeat that error; RabbitMQ's publisher confirms answer per message anyway)."""
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
    try:
        replies = _dispatch(broker, prepared)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            # Redis lost its script cache (a restart, SCRIPT FLUSH): those scripts never ran. Loaded
            # again, they run once more; the others' replies stand.
            script = broker.scripts["dispatch"]
            script.sha = broker.client.script_load(script.script)
            for i, reply in zip(missing, _dispatch(broker, [prepared[i] for i in missing]), strict=True):
                replies[i] = reply
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


def _dispatch(broker: RedisBroker, messages: Sequence[dramatiq.Message]) -> list[Any]:
    """One pipeline of EVALSHA of dramatiq's dispatch script, one per message, then one wake-up per
    queue for its idle consumers (``app.broker.wake_channel``); the scripts' replies, errors included.
    By its hash, not through redis-py's Script on the pipeline: that runs SCRIPT EXISTS before every
    pipeline, a round trip per batch for what the replies say anyway (NOSCRIPT)."""
    sha = broker.scripts["dispatch"].sha
    with broker.client.pipeline(transaction=False) as pipe:
        for message in messages:
            pipe.evalsha(sha, 1, broker.namespace, "enqueue", current_millis(), message.queue_name, broker.broker_id,
                         broker.heartbeat_timeout, broker.dead_message_ttl, broker._should_do_maintenance("enqueue"),
                         broker._max_unpack_size(), message.options["redis_message_id"], message.encode())
        # After the scripts, in the same round trip: a consumer woken by it finds the messages there.
        for queue_name in dict.fromkeys(m.queue_name for m in messages):
            pipe.publish(wake_channel(broker.namespace, queue_name), b"")
        return pipe.execute(raise_on_error=False)[:len(messages)]


class Relay:
    """Publishes the outbox. ``db`` must run as ``exports_dispatcher``: it may read the outbox and set
    ``published_at``, nothing else."""

    def __init__(self, settings: Settings, db: Database, broker: Broker, *, queue_name: str = EXPORT_QUEUE):
        if db.role is not Role.DISPATCHER:
            raise ConfigError(f"the relay runs as {Role.DISPATCHER.value}, not {db.role.value}")
        if settings.relay_batch_size < 1 or settings.relay_poll_seconds <= 0:
            raise ConfigError("relay_batch_size must be at least 1 and relay_poll_seconds positive")
        self.settings = settings
        self.db = db
        self.broker = broker
        self.queue_name = queue_name
        #: Set once the listener is subscribed: a row inserted after this wakes the relay.
        self.listening = threading.Event()

    # -- one pass -------------------------------------------------------------------------------

    def run_once(self) -> int:
        """One batch in one transaction; returns how many messages were published and marked."""
        return self._pass().published

    def _pass(self) -> RelayPass:
        with self.db.connection() as conn, conn.transaction():
            batch = claim_batch(conn, batch_size=self.settings.relay_batch_size)
            rows = batch.rows
            metrics.relay().lag.set(_age_seconds(rows[0].due) if rows else 0.0)
            published, broker_failed = self._publish(rows)
            if published:
                marked = mark_published(conn, message_ids=published)
                if marked != len(published):
                    # Impossible while this transaction holds the rows' locks. Roll back: the rows
                    # are republished with the same ids, which the worker deduplicates.
                    raise errors.ChangedUnderLock(
                        f"marked {marked} of {len(published)} outbox rows this relay holds locked")
        metrics.relay().published.inc(len(published))
        # Rows the broker refused are due again at once, as they were before this pass took them.
        next_due = 0.0 if broker_failed else batch.next_due_seconds
        return RelayPass(claimed=len(rows), published=len(published), broker_failed=broker_failed,
                         next_due_seconds=next_due, batch_size=self.settings.relay_batch_size)

    def _publish(self, rows: list[OutboxMessage]) -> tuple[list[UUID], bool]:
        """Enqueues the batch (one round trip on Redis); returns the rows the broker took, and whether it
        refused any. Only those are marked: the rest stay unpublished for the next pass."""
        publishable = []
        for row in rows:
            if row.kind != EXPORT_READY:
                # No actor takes it; leave it unpublished and visible rather than mark a lie.
                log.error("relay.unknown_kind", message_id=row.message_id, job_id=row.job_id, tenant_id=row.tenant_id,
                          kind=row.kind)
                continue
            publishable.append(row)
        results = enqueue_batch(self.broker, [message_for(row, queue_name=self.queue_name) for row in publishable])
        published = []
        for row, error in zip(publishable, results, strict=True):
            if error is None:
                published.append(row.message_id)
                # Per message, at INFO, so one export can be followed from its outbox row to the worker's
                # log by any of its ids (it costs: once a fifth of the relay's time at full speed).
                log.info("relay.enqueued", message_id=row.message_id, job_id=row.job_id, tenant_id=row.tenant_id)
        refused = [(row, error) for row, error in zip(publishable, results, strict=True) if error is not None]
        if refused:
            # The broker is down or refused: those rows stay unpublished for the next pass. Only the
            # error's class is logged; a broker error can carry its URL.
            metrics.relay().broker_failures.inc(len(refused))
            row, error = refused[0]
            log.warning("relay.broker_unavailable", message_id=row.message_id, job_id=row.job_id,
                        tenant_id=row.tenant_id, error=type(error).__name__, refused=len(refused),
                        published=len(published))
        return published, bool(refused)

    def drain(self) -> int:
        """Passes until a batch comes back short (or the broker refuses); returns messages published."""
        return self._drain().published

    def _drain(self) -> RelayPass:
        """The passes of a drain, summed; the next due row as the last pass saw it."""
        total = 0
        while True:
            result = self._pass()
            total += result.published
            if result.drained:
                break
        if total:
            log.debug("relay.published", count=total)
        return dataclasses.replace(result, published=total)

    # -- the loop -------------------------------------------------------------------------------

    def run_forever(self, stop_event: threading.Event) -> None:
        """Drain, then wait for a NOTIFY or the poll interval, until ``stop_event`` is set. A database
        or broker failure is logged and retried; it never ends the loop."""
        listener: psycopg.Connection | None = None
        try:
            while not stop_event.is_set():
                if listener is None or listener.closed or listener.broken:
                    listener = self._listen(listener)
                # Subscribed before draining, so a row committed during the drain still wakes us.
                try:
                    drained = self._drain()
                except Exception as exc:
                    log.warning("relay.pass_failed", error=type(exc).__name__)
                    stop_event.wait(FAILURE_BACKOFF_SECONDS)
                    continue
                self._wait(listener, stop_event, drained.next_due_seconds)
        finally:
            self.listening.clear()
            if listener is not None:
                listener.close()

    def _listen(self, old: psycopg.Connection | None) -> psycopg.Connection | None:
        if old is not None:
            old.close()
        self.listening.clear()
        try:
            conn = connect(self.db.url, Role.DISPATCHER, application_name="exports-relay-listen")
            connector.listen(conn, OUTBOX_CHANNEL)
        except Exception as exc:
            # Without a listener the poll interval still drains the outbox.
            log.warning("relay.listen_failed", error=type(exc).__name__)
            return None
        self.listening.set()
        return conn

    def _wait(self, listener: psycopg.Connection | None, stop_event: threading.Event,
              next_due: float | None) -> None:
        wait = self.settings.relay_poll_seconds
        if next_due is not None:
            # A floor, so a due row another relay holds locked does not make this one spin.
            wait = min(wait, max(next_due, DUE_WAIT_FLOOR_SECONDS))
        deadline = time.monotonic() + wait
        while not stop_event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            timeout = min(remaining, STOP_CHECK_SECONDS)
            if listener is None:
                stop_event.wait(timeout)
                continue
            try:
                if any(True for _ in listener.notifies(timeout=timeout, stop_after=1)):
                    return
            except Exception as exc:
                # The listener is re-opened by the loop; the drain that follows covers the gap.
                log.warning("relay.listener_lost", error=type(exc).__name__)
                return


def run_forever(settings: Settings, url: str, stop_event: threading.Event) -> None:
    """The ``exports relay`` process on the database ``url`` (the application's login, resolved by its
    entry point): a dispatcher-role pool, the configured broker, the loop."""
    broker = build_broker(settings)
    with Database(url, Role.DISPATCHER, min_size=1, max_size=2, name="exports-relay") as db:
        beating = Heartbeat(db, "relay", interval_seconds=settings.heartbeat_seconds).start()
        metrics.announce_build()
        try:
            metrics.serve(settings.relay_metrics)
        except OSError as exc:
            # Metrics are not worth stopping the outbox for: say so, and run without them.
            log.error("metrics.unavailable", address=settings.relay_metrics, error=type(exc).__name__)
        log.info("relay.started", batch_size=settings.relay_batch_size, poll_seconds=settings.relay_poll_seconds)
        try:
            Relay(settings, db, broker).run_forever(stop_event)
        finally:
            broker.close()
            beating.stop()
            log.info("relay.stopped")
