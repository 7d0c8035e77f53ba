"""Ceilings (b) and (c) of the end-to-end figure: the same export body as a Procrastinate task and as
a pgqueuer entrypoint, on the same PostgreSQL (the bench database, their schemas beside ours).

Each runs in ``WORKERS`` worker processes of ``CONCURRENCY`` each, as ours runs 2 processes x 2
threads: Procrastinate's worker with ``concurrency=2`` (it runs a synchronous task in a thread of its
event loop's executor), pgqueuer's ``QueueManager`` with ``max_concurrent_tasks=2`` (its entrypoints
are asynchronous: the body runs in ``asyncio.to_thread``, as its documentation says to). Every worker
thread keeps a warm connection and a warm SFTP session (``bench.export_body.Exporter``). The job row is
the queue's own: deferring or enqueueing inserts it, the worker marks it done (Procrastinate) or
moves it to its log (pgqueuer). Both keep their defaults otherwise (LISTEN/NOTIFY on, durable tables).

The load generator is the harness's ``closed_loop.Generator``: it defers with the peer's own
synchronous API and polls the peer's job table by primary key.

pgqueuer's workers run on its asyncpg driver, the one its documentation leads with and a user would pick.
Its psycopg driver reads NOTIFYs and runs queries on one connection, and at two jobs per worker paused up
to a second (its NOTIFY reader's timeout) between jobs: 9 exports/s where asyncpg gives 295-380, a
baseline no user would see.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from collections.abc import Callable, Hashable, Mapping
from multiprocessing import get_context
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.closed_loop import Generator
from bench.export_body import Exporter, Target

WORKERS = 2
CONCURRENCY = 2
QUEUE = "bench_exports"
TASK = "bench_export"
STOP_TIMEOUT = 30.0


def _exporter(local: threading.local, target: Target) -> Exporter:
    """This thread's warm exporter, opened on its first export."""
    exporter = getattr(local, "exporter", None)
    if exporter is None:
        exporter = local.exporter = Exporter(target)
    return exporter


# --- Procrastinate -------------------------------------------------------------------------------


def procrastinate_install(url: str) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
    app.open()
    try:
        app.schema_manager.apply_schema()
    finally:
        app.close()


def procrastinate_worker(url: str, target: dict[str, Any], concurrency: int) -> None:
    """A spawned worker process; SIGTERM stops it gracefully (Procrastinate's own handler)."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    local = threading.local()
    body = Target(**target)

    @app.task(name=TASK, queue=QUEUE)
    def export(name: str) -> None:
        _exporter(local, body).export(name)

    app.run_worker(queues=[QUEUE], concurrency=concurrency, install_signal_handlers=True)


class ProcrastinateQueue:
    def __init__(self, url: str) -> None:
        import procrastinate

        self.app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
        self.app.open()
        self.deferrer = self.app.configure_task(TASK, queue=QUEUE)
        self.reader = psycopg.connect(url, autocommit=True)

    def submit(self) -> Hashable:
        return self.deferrer.defer(name=uuid.uuid4().hex)

    def ended(self, ids: list[Hashable]) -> Mapping[Hashable, str]:
        rows = self.reader.execute("SELECT id, status::text FROM procrastinate_jobs"
                                   " WHERE id = ANY(%s) AND status NOT IN ('todo', 'doing')", (ids,)).fetchall()
        return dict(rows)

    def close(self) -> None:
        self.app.close()
        self.reader.close()


# --- pgqueuer ------------------------------------------------------------------------------------


async def asyncpg_connect(url: str) -> Any:
    """An asyncpg connection to ``url``, a libpq conninfo string, which asyncpg does not read."""
    import asyncpg

    params = conninfo_to_dict(url)
    return await asyncpg.connect(host=params.get("host"), port=params.get("port"), user=params.get("user"),
                                 password=params.get("password"), database=params.get("dbname"))


def pgqueuer_install(url: str) -> None:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def install() -> None:
        conn = await asyncpg_connect(url)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    asyncio.run(install())


def pgqueuer_worker(url: str, target: dict[str, Any], concurrency: int) -> None:
    """A spawned worker process; SIGTERM sets the manager's shutdown event."""
    asyncio.run(_pgqueuer_worker(url, Target(**target), concurrency))


async def _pgqueuer_worker(url: str, target: Target, concurrency: int) -> None:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg_connect(url)
    manager = QueueManager(Queries(AsyncpgDriver(conn)))
    local = threading.local()

    @manager.entrypoint(TASK)
    async def export(job) -> None:
        await asyncio.to_thread(lambda: _exporter(local, target).export(job.payload.decode()))

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
    try:
        # pgqueuer requires max_concurrent_tasks >= 2 x batch_size.
        await manager.run(batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency)
    finally:
        await conn.close()


class PgqueuerQueue:
    _ENDED = """
        SELECT i.id, (SELECT l.status::text FROM pgqueuer_log l WHERE l.job_id = i.id
                      ORDER BY l.created DESC, l.id DESC LIMIT 1)
        FROM unnest(%s::bigint[]) AS i(id)
        WHERE NOT EXISTS (SELECT 1 FROM pgqueuer q WHERE q.id = i.id)
    """

    def __init__(self, url: str) -> None:
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        self.conn = psycopg.connect(url, autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.conn))
        self.reader = psycopg.connect(url, autocommit=True)

    def submit(self) -> Hashable:
        return self.queries.enqueue(TASK, uuid.uuid4().hex.encode())[0]

    def ended(self, ids: list[Hashable]) -> Mapping[Hashable, str]:
        # A job leaves the queue table in the statement that logs its end.
        return {job: status or "unknown" for job, status in self.reader.execute(self._ENDED, (ids,)).fetchall()}

    def close(self) -> None:
        self.conn.close()
        self.reader.close()


# --- the side ------------------------------------------------------------------------------------


class PeerSide:
    """A peer's worker processes (spawned) and the harness's load generator deferring to them."""

    def __init__(self, name: str, url: str, target: Target, worker: Callable[..., None],
                 queue: Callable[[str], Any], backlog: int) -> None:
        self.name = name
        self.url = url
        self.target = target
        self._worker = worker
        self._queue = queue
        self.backlog = backlog
        self._mp = get_context("spawn")
        self._processes: list[Any] = []
        self._generator: Generator | None = None

    def start(self) -> None:
        self._processes = [self._mp.Process(target=self._worker, args=(self.url, self.target.as_dict(), CONCURRENCY),
                                            name=f"{self.name}-{i + 1}", daemon=True) for i in range(WORKERS)]
        for process in self._processes:
            process.start()
        self._generator = Generator(self._queue(self.url), self.backlog).start()

    def completed(self) -> int:
        return self._generator.completed if self._generator else 0

    def generator_transactions(self) -> int:
        return self._generator.polls if self._generator else 0

    def python_pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def mark(self) -> None:
        pass

    def check(self) -> None:
        if self._generator is not None:
            self._generator.check()
        dead = [p.name for p in self._processes if not p.is_alive()]
        if dead:
            raise RuntimeError(f"{self.name}: worker processes exited: {dead}")

    def stop(self) -> dict[str, int]:
        statuses: dict[str, int] = {}
        try:
            if self._generator is not None:
                statuses = self._generator.stop()
        finally:
            for process in self._processes:
                if process.is_alive():
                    process.terminate()
            for process in self._processes:
                process.join(STOP_TIMEOUT)
                if process.is_alive():
                    process.kill()
                    process.join()
            self._processes = []
            self._generator = None
        return statuses


def procrastinate_side(url: str, target: Target, backlog: int) -> PeerSide:
    return PeerSide("Procrastinate", url, target, procrastinate_worker, ProcrastinateQueue, backlog)


def pgqueuer_side(url: str, target: Target, backlog: int) -> PeerSide:
    return PeerSide("pgqueuer", url, target, pgqueuer_worker, PgqueuerQueue, backlog)


def install(kind: str, url: str) -> None:
    {"procrastinate": procrastinate_install, "pgqueuer": pgqueuer_install}[kind](url)

