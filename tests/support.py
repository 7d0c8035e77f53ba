"""Tools that force interleavings in tests: a call on its own thread, a pool of threads, and the wait
for a backend to block on a lock, confirmed from the server's own lock graph (``pg_blocking_pids``)
rather than hoped for. Loaded as a fixture plugin too (``threads``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, NoReturn, TypeVar

import psycopg
import pytest

from exports_devtools.waiting import wait_until

T = TypeVar("T")
#: A backend: a connection, or its backend pid.
Backend = psycopg.Connection | int

#: How long a test waits for a statement to be seen blocked, or for a thread to finish, in seconds.
WAIT_SECONDS = 30.0


IN_CI = os.environ.get("CI") == "true"


def unavailable(message: str) -> NoReturn:
    """What a test does when a service or tool it needs is missing: skips on a developer's machine, and
    fails under CI=true, where every test must run."""
    if IN_CI:
        pytest.fail(f"CI=true: {message}", pytrace=False)
    pytest.skip(message)


def _pid(backend: Backend) -> int:
    return backend if isinstance(backend, int) else backend.info.backend_pid


def wait_until_blocked(admin: psycopg.Connection, waiting: Backend, by: Backend | None = None,
                       timeout: float = WAIT_SECONDS) -> list[int]:
    """Returns the blockers of ``waiting``'s backend once it waits on a lock (held by ``by``'s
    backend, when given), so the test knows the statement waits rather than hoping it does."""
    pid = _pid(waiting)

    def blockers() -> list[int]:
        found = admin.execute("SELECT pg_blocking_pids(%s) AS pids", (pid,)).fetchone()["pids"]
        return found if found and (by is None or _pid(by) in found) else []

    blocker = f" by backend {_pid(by)}" if by is not None else ""
    return wait_until(blockers, f"backend {pid} to wait on a lock{blocker}", timeout, interval=0.01)


class Background(Generic[T]):
    """Runs one call on its own thread; ``result()`` returns its value or re-raises its exception."""

    def __init__(self, call: Callable[[], T]):
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:   # handed to the test thread by result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = WAIT_SECONDS) -> T:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the background call did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    """Threads for calls that must wait on a lock while the test goes on."""
    executor = ThreadPoolExecutor(max_workers=4)
    yield executor
    # A failed test may leave a thread waiting on a lock; closing the connections releases it.
    executor.shutdown(wait=False, cancel_futures=True)
