"""The notifier: sends the webhook deliveries the outcome statements wrote, as ``exports_notifier``.

A pass claims a batch of due deliveries (``webhooks_claim_batch``: a lease committed before any request,
``FOR UPDATE SKIP LOCKED``, so any number of notifiers and threads share the work; endpoints take turns,
one delivery each at a time, and an endpoint that failed rests until its failing delivery's retry, so a slow
or dead receiver never holds the other tenants' events), then, all at once, for each renders
its body, signs it with the endpoint's secret as read now, POSTs it and records the answer with the
delivery's next state in one statement (``webhooks_record_attempt``): delivered on a 2xx; otherwise due
again after an exponential backoff with jitter, or dead once that would fall past the give-up horizon.

Nothing is lost and nothing is sent under two ids: a delivery is only ever re-sent under its own id (a
notifier that died mid-request, a reply lost while recording, a receiver that took the event and then
timed out all lead to the same event again, which the receiver deduplicates on ``webhook-id``).

Why a process of its own rather than a thread of the relay: a receiver may keep a request for the whole
timeout, and the relay's wake-ups must never wait behind a tenant's server; the relay's role may not
read jobs, which a body needs; the notifier reaches the internet, the relay only the broker; and each
scales, and fails, on its own. It polls rather than listens: a NOTIFY in the outcome statements would
put a commit-time global lock on every terminal write.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from app import logs, metrics
from app.config import ConfigError, Settings
from app.heartbeat import Heartbeat, identity
from app.store import webhooks as store
from app.store.database import Database
from app.store.types import Role
from app.store.webhooks import DeliveryState
from app.webhooks import payload, signing
from app.webhooks.client import Answer, Poster

log = logs.get(__name__)

#: Seconds a claim's lease outlasts its requests' connect and read timeouts (the batch's go out at once).
LEASE_SLACK_SECONDS = 30.0
#: Seconds to wait after a pass failed (the database unreachable) before the next.
FAILURE_BACKOFF_SECONDS = 2.0


class Post(Protocol):
    def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> Answer: ...


@dataclass(frozen=True)
class SenderConfig:
    timeout_seconds: float = 10.0
    batch_size: int = 10
    poll_seconds: float = 1.0
    senders: int = 4
    backoff_base_seconds: float = 10.0
    backoff_max_seconds: float = 3600.0
    give_up_seconds: float = 3 * 86400.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.senders < 1 or self.timeout_seconds <= 0 or self.poll_seconds <= 0:
            raise ConfigError("the notifier needs a batch, a sender, a timeout and a poll interval")
        if not 0 < self.backoff_base_seconds <= self.backoff_max_seconds:
            raise ConfigError("the webhook backoff's base must be positive and at most its maximum")

    @classmethod
    def from_settings(cls, settings: Settings) -> SenderConfig:
        return cls(timeout_seconds=settings.webhook_timeout_seconds, batch_size=settings.webhook_batch_size,
                   poll_seconds=settings.webhook_poll_seconds, senders=settings.webhook_senders,
                   backoff_base_seconds=settings.webhook_backoff_base_seconds,
                   backoff_max_seconds=settings.webhook_backoff_max_seconds,
                   give_up_seconds=settings.webhook_give_up_seconds)

    @property
    def lease_seconds(self) -> float:
        """Long enough for a batch's deliveries to be answered, or to time out, and be recorded before another
        notifier may claim them again: the requests go out at once, so one request's connect and read
        timeouts bound them, and the slack covers an answer waiting for a pooled connection. It is also
        how long a killed notifier's claim keeps its endpoint's turn (a stopping one hands it back)."""
        return 2 * self.timeout_seconds + LEASE_SLACK_SECONDS


def backoff_seconds(attempt: int, config: SenderConfig, rng: random.Random | None = None) -> float:
    """Before the try after ``attempt``: base * 2^(attempt - 1), capped, then jittered into its upper
    half, so receivers that come back are not hit by every notifier at the same instant."""
    ceiling = min(config.backoff_max_seconds, config.backoff_base_seconds * 2 ** min(attempt - 1, 62))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


@dataclass
class PassCounts:
    """What one pass did. ``lost``: answers recorded after another notifier had claimed the delivery
    again (this one's lease ran out); ``unrecorded``: answers the database did not take (it will be
    sent again when the lease ends)."""

    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    dead: int = 0
    dropped: int = 0
    lost: int = 0
    unrecorded: int = 0
    #: Claimed and handed back unsent, the notifier stopping.
    released: int = 0

    def add(self, other: PassCounts) -> None:
        """Adds what one delivery of the batch came to (its claim is already counted)."""
        for f in dataclasses.fields(self):
            if f.name != "claimed":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Sender:
    """Sends due deliveries. ``db`` must run as ``exports_notifier``."""

    db: Database
    config: SenderConfig
    post: Post
    #: host:pid, recorded with each attempt.
    sender_id: str
    env: dict[str, str] | None = None
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.db.role is not Role.NOTIFIER:
            raise ConfigError(f"the notifier runs as {Role.NOTIFIER.value}, not {self.db.role.value}")

    def run_once(self, stop_event: threading.Event | None = None) -> PassCounts:
        """One batch, claimed and committed (at most one delivery per live endpoint: endpoints take turns),
        then sent at once, each request on a thread of its own and each answer recorded on its own: a
        receiver that holds its request past the timeout delays its own delivery, not the batch's others.
        If ``stop_event`` is set before the requests go out, the batch is handed back unsent."""
        with self.db.connection() as conn:
            claimed = store.claim_batch(conn, batch_size=self.config.batch_size,
                                        lease_seconds=self.config.lease_seconds)
        counts = PassCounts(claimed=len(claimed))
        if stop_event is not None and stop_event.is_set():
            self._hand_back(claimed, counts)
            return counts
        if claimed:
            with ThreadPoolExecutor(max_workers=len(claimed), thread_name_prefix="exports-webhook") as pool:
                for sent in pool.map(self._bound, claimed):
                    counts.add(sent)
        return counts

    def _bound(self, delivery: store.Claimed) -> PassCounts:
        """One delivery sent and recorded, its ids bound to every line about it; what it came to."""
        counts = PassCounts()
        with logs.bound(job_id=delivery.job_id, webhook_id=delivery.id):
            self._one(delivery, counts)
        return counts

    def _hand_back(self, unsent: list[store.Claimed], counts: PassCounts) -> None:
        try:
            with self.db.connection() as conn:
                counts.released = store.release(conn, [d for d in unsent if not d.removed])
        except Exception as exc:
            # Their lease ends all the same; then they are due again.
            log.warning("notifier.release_failed", deliveries=len(unsent), error=type(exc).__name__)

    def _one(self, delivery: store.Claimed, counts: PassCounts) -> None:
        if delivery.removed:
            counts.dropped += 1
            log.info("webhook.dropped", endpoint=delivery.endpoint_name, reason="the endpoint was removed")
            return
        started = datetime.now(UTC)
        answer = self._send(delivery)
        retry_in = backoff_seconds(delivery.attempt, self.config, self.rng)
        try:
            with self.db.connection() as conn:
                state = store.record_attempt(
                    conn, delivery_id=delivery.id, attempt=delivery.attempt, sender=self.sender_id,
                    started_at=started, http_status=answer.http_status, error=answer.error,
                    delivered=answer.delivered, retry_in_seconds=retry_in,
                    give_up_seconds=self.config.give_up_seconds)
        except Exception as exc:
            # Committed or not, the delivery is leased until its lease ends, then due again: at worst the
            # receiver gets the same event under the same id once more.
            counts.unrecorded += 1
            log.warning("webhook.record_failed", endpoint=delivery.endpoint_name, attempt=delivery.attempt,
                        result=answer.result, error=type(exc).__name__)
            return
        metrics.notifier().requests.labels("delivered" if answer.delivered else "failed").inc()
        metrics.notifier().request_seconds.observe(answer.seconds)
        self._count(delivery, answer, state, retry_in, counts)

    def _send(self, delivery: store.Claimed) -> Answer:
        body = payload.body(delivery)
        try:
            keys = signing.resolve(delivery.secret_ref, self.env)
        except signing.SecretError as exc:
            # An operator's to fix, in this notifier's environment; retried like a receiver that is down.
            return Answer(None, f"signing secret unavailable: {exc}", 0.0)
        return self.post(delivery.url, body, signing.headers(keys, str(delivery.id), body))

    def _count(self, delivery: store.Claimed, answer: Answer, state: DeliveryState | None, retry_in: float,
               counts: PassCounts) -> None:
        common = dict(endpoint=delivery.endpoint_name, attempt=delivery.attempt, result=answer.result,
                      status=delivery.status)
        if state is None:
            counts.lost += 1
            log.info("webhook.claim_lost", **common)
        elif state is DeliveryState.DELIVERED:
            counts.delivered += 1
            log.debug("webhook.delivered", seconds=round(answer.seconds, 3), **common)
        elif state is DeliveryState.DEAD:
            counts.dead += 1
            metrics.notifier().dead.inc()
            log.warning("webhook.dead", occurred_at=delivery.occurred_at,
                        give_up_seconds=self.config.give_up_seconds, **common)
        else:
            counts.retrying += 1
            log.info("webhook.retrying", retry_in=round(retry_in, 1), **common)

    # -- the loop -------------------------------------------------------------------------------

    def run_forever(self, stop_event: threading.Event) -> None:
        """``senders`` threads, each passing until a pass claims nothing, then waiting the poll interval;
        until ``stop_event`` is set. A failed pass is logged and tried again."""
        threads = [threading.Thread(target=self._loop, args=(stop_event,), name=f"exports-notifier-{n}",
                                    daemon=True) for n in range(self.config.senders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _loop(self, stop_event: threading.Event) -> None:
        while not stop_event.is_set():
            try:
                counts = self.run_once(stop_event)
            except Exception as exc:
                log.warning("notifier.pass_failed", error=type(exc).__name__)
                stop_event.wait(FAILURE_BACKOFF_SECONDS)
                continue
            if counts.claimed == 0:
                # Endpoints take turns (one delivery each per pass), so a short batch is no sign that
                # nothing is due: only an empty one is.
                stop_event.wait(self.config.poll_seconds)


def run_forever(settings: Settings, url: str, stop_event: threading.Event) -> None:
    """The ``exports notifier`` process on the database ``url`` (the application's login, resolved by its
    entry point): a notifier-role pool, the HTTP client, the heartbeat, the metrics, the loop."""
    config = SenderConfig.from_settings(settings)
    poster = Poster(timeout_seconds=config.timeout_seconds)
    # A connection per sender for its claims, and as many for the answers of its batch, recorded as they come
    # (an answer waits a moment for one rather than open a connection per request in flight).
    with Database(url, Role.NOTIFIER, min_size=1, max_size=2 * config.senders + 1, name="exports-notifier") as db:
        beating = Heartbeat(db, "notifier", interval_seconds=settings.heartbeat_seconds).start()
        try:
            metrics.serve(settings.notifier_metrics)
            metrics.announce_build()
        except OSError as exc:
            log.error("metrics.unavailable", address=settings.notifier_metrics, error=type(exc).__name__)
        log.info("notifier.started", senders=config.senders, batch_size=config.batch_size,
                 timeout_seconds=config.timeout_seconds, give_up_seconds=config.give_up_seconds)
        try:
            Sender(db, config, poster.post, identity("notifier").process_id).run_forever(stop_event)
        finally:
            poster.close()
            beating.stop()
            log.info("notifier.stopped")
