"""Workload 3: the relay draining a backlog of unpublished outbox rows.

Ours: ``app.relay.Relay.run_once`` in a loop until a batch comes back short, as ``exports relay`` drains
(dispatcher role, batches of 200, the configured Redis broker with the deduplication middleware, and
the process's INFO logging to a file). Ceilings, in the same interpreter, for the same number of
messages: a bare ``broker.enqueue(message_for(row))`` loop with no database, and a Redis pipeline
sending Dramatiq's own enqueue script with the same arguments, one pipeline per batch of 200.
Decay: the drain's rate at its end against its start (last and first 30 s of a 3-minute drain in
full mode; the last and first fifth of each drain in quick mode).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from datetime import UTC, datetime

import psycopg

from app.broker import build_broker
from app.config import Settings
from app.relay import Relay, message_for
from app.store.database import Database
from app.store.relay import OutboxMessage
from app.store.types import Role
from bench import system
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, log, settle, value_at_least

LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


def seed_outbox(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO outbox (message_id, kind, job_id, created_at)"
                     " SELECT gen_random_uuid(), 'ExportReady', gen_random_uuid(),"
                     " clock_timestamp() FROM generate_series(1, %s)", (rows,))


@contextlib.contextmanager
def process_logging(path):
    """INFO to a file, as ``exports relay`` logs (its stderr goes to a file)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def drain(relay: Relay, batch: int) -> tuple[float, list[tuple[float, int]]]:
    """Passes until one comes back short; seconds taken and the (seconds, published) timeline."""
    published = 0
    timeline = [(0.0, 0)]
    started = time.perf_counter()
    while True:
        n = relay.run_once()
        published += n
        timeline.append((time.perf_counter() - started, published))
        if n < batch:
            return time.perf_counter() - started, timeline


def decay(timeline: list[tuple[float, int]], window: float | None) -> float:
    """Rate in the last window over the rate in the first (a fifth of the drain when window is None)."""
    total = timeline[-1][0]
    window = window or total / 5

    def rate(a: float, b: float) -> float:
        inside = [(t, n) for t, n in timeline if a <= t <= b]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else float("nan")

    # The final pass is short (it found the backlog empty): leave it out of the last window.
    end = timeline[-2][0] if len(timeline) > 2 else total
    return rate(end - window, end) / rate(0, window)


def fake_rows(n: int) -> list[OutboxMessage]:
    now = datetime.now(UTC)
    return [OutboxMessage(uuid.uuid4(), "ExportReady", uuid.uuid4(), now) for _ in range(n)]


def enqueue_loop(broker, rows: list[OutboxMessage]) -> float:
    started = time.perf_counter()
    for row in rows:
        broker.enqueue(message_for(row))
    return time.perf_counter() - started


def pipelined(broker, rows: list[OutboxMessage], batch: int) -> float:
    """Dramatiq's Redis enqueue (its ``dispatch`` script, same arguments), one pipeline per batch."""
    from dramatiq.common import current_millis

    script = broker.scripts["dispatch"]
    started = time.perf_counter()
    for i in range(0, len(rows), batch):
        with broker.client.pipeline(transaction=False) as pipe:
            for row in rows[i:i + batch]:
                message = message_for(row).copy(options={"redis_message_id": str(uuid.uuid4())})
                script(keys=[broker.namespace], args=[
                    "enqueue", current_millis(), message.queue_name, broker.broker_id, broker.heartbeat_timeout,
                    broker.dead_message_ttl, 0, broker._max_unpack_size(),
                    message.options["redis_message_id"], message.encode()], client=pipe)
            pipe.execute()
    return time.perf_counter() - started


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    n = sizes.relay_rows
    settings = Settings(broker_url=ctx.broker_url)
    batch = settings.relay_batch_size
    url = ctx.fresh_database("relay")
    broker = build_broker(settings)
    outcome = Outcome()
    timelines: list[list[tuple[float, int]]] = []
    pipelines: list[float] = []
    try:
        with Database(url, Role.DISPATCHER, min_size=1, max_size=2, name="bench-relay") as db, \
                process_logging(ctx.work_dir / "relay.log"):
            relay = Relay(settings, db, broker)
            seed_outbox(url, 500)
            drain(relay, batch)   # warm-up: connections, prepared statements, the broker's scripts
            enqueue_loop(broker, fake_rows(500))

            def ours() -> float:
                system.flush_broker(ctx.broker_url)
                seed_outbox(url, n)
                settle(url)
                seconds, timeline = drain(relay, batch)
                assert timeline[-1][1] == n, f"published {timeline[-1][1]} of {n}"
                timelines.append(timeline)
                log(f"   relay {n / seconds:.0f} rows/s")
                return n / seconds

            def ceiling() -> float:
                system.flush_broker(ctx.broker_url)
                rate = n / enqueue_loop(broker, fake_rows(n))
                system.flush_broker(ctx.broker_url)
                pipelines.append(n / pipelined(broker, fake_rows(n), batch))
                log(f"   enqueue loop {rate:.0f}/s, pipeline {pipelines[-1]:.0f}/s")
                return rate

            ceilings, ourselves = ctx.paired(ceiling, ours)
            long_decay = None
            if sizes.relay_decay_seconds:
                rows = int(Stat.of(ourselves).median * sizes.relay_decay_seconds * 1.05)
                log(f"   a {sizes.relay_decay_seconds:.0f} s drain of {rows} rows")
                system.flush_broker(ctx.broker_url)
                seed_outbox(url, rows)
                settle(url)
                _, timeline = drain(relay, batch)
                long_decay = decay(timeline, 30.0)
                outcome.series["published rows vs seconds, the long drain"] = {"relay": timeline[::10]}
    finally:
        broker.close()
        system.flush_broker(ctx.broker_url)
    outcome.rows += [
        Row(f"rows published draining {n:,}", "rows/s", Stat.of(ourselves), Stat.of(ceilings),
            "bare broker.enqueue loop", at_least(0.8), versus="baseline"),
        Row(f"rows published draining {n:,}, against a pipeline", "rows/s", Stat.of(ourselves), Stat.of(pipelines),
            f"Redis pipeline, same script, {batch} per batch"),
    ]
    if long_decay is not None:
        outcome.rows.append(Row(f"decay: last 30 s / first 30 s of a {sizes.relay_decay_seconds:.0f} s drain",
                                "fraction", Stat.of([long_decay]), goal=value_at_least(0.85, ">= 0.85")))
    else:
        outcome.rows.append(Row("decay: rate in the last fifth / first fifth of each drain", "fraction",
                                Stat.of([decay(t, None) for t in timelines]), goal=value_at_least(0.85, ">= 0.85")))
    outcome.notes.append(f"Batches of {batch} (the default EXPORTS_RELAY_BATCH); the relay logs at INFO to a file "
                         "as the `exports relay` process does; Redis " + ctx.broker_url + ".")
    outcome.series["published rows vs seconds"] = {f"run {i + 1}": t[::max(1, len(t) // 200)]
                                                   for i, t in enumerate(timelines)}
    return outcome


WORKLOAD = Workload("3", "Relay", "Rows published per second draining unpublished outbox rows through "
                    "`app.relay.Relay` (as `exports relay` does, INFO logging included), against a bare "
                    "`broker.enqueue` loop in the same interpreter and a Redis pipeline of the same enqueue "
                    "script; and how the rate holds up from the start of a drain to its end.", run)
