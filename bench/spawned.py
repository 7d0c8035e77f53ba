"""A side of the end-to-end workload that runs in a process of its own (spawned, so it shares nothing with
the bench's): ``threads`` threads, each with a loop of its own made in that process, each counting the
exports it completed in shared memory until a shared event stops them. The least-work exporter and the
protocol floor are two such sides; each brings only its loop.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing import get_context
from typing import Any, Protocol

#: Seconds the process gets to end its loops once told to stop.
STOP_TIMEOUT = 30.0


class Loop(Protocol):
    """One thread's warm connections and session."""

    def one(self) -> bool:
        """One turn of the loop; True when it completed an export."""
        ...

    def close(self) -> None: ...


def _thread(make: Callable[..., Loop], args: tuple[Any, ...], counter: Any, stop: Any, failed: Any) -> None:
    loop = None
    try:
        loop = make(*args)
        while not stop.is_set():
            if loop.one():
                with counter.get_lock():
                    counter.value += 1
    except BaseException:
        failed.value = 1
        traceback.print_exc(file=sys.stderr)
    finally:
        if loop is not None:
            loop.close()


def _main(make: Callable[..., Loop], args: tuple[Any, ...], threads: int, counter: Any, stop: Any,
          failed: Any) -> None:
    """The spawned process: ``threads`` loops until ``stop`` is set."""
    workers = [threading.Thread(target=_thread, args=(make, args, counter, stop, failed), name=f"loop-{i}")
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


class SpawnedSide:
    """``threads`` loops made by ``make(*args)`` in a spawned process, as a side of the workload; ``prepare``
    runs in the bench before each start. Its exports end as ``status``."""

    def __init__(self, name: str, make: Callable[..., Loop], args: tuple[Any, ...], threads: int, status: str,
                 prepare: Callable[[], None] | None = None) -> None:
        self.name = name
        self.make, self.args, self.threads, self.status = make, args, threads, status
        self.prepare = prepare
        self._mp = get_context("spawn")
        self._process: Any = None

    def start(self) -> None:
        if self.prepare is not None:
            self.prepare()
        self.counter = self._mp.Value("q", 0)
        self.failed = self._mp.Value("b", 0)
        self.stop_event = self._mp.Event()
        self._process = self._mp.Process(target=_main, name=self.name.replace(" ", "-"), daemon=True, args=(
            self.make, self.args, self.threads, self.counter, self.stop_event, self.failed))
        self._process.start()

    def completed(self) -> int:
        return int(self.counter.value)

    def generator_transactions(self) -> int:
        return 0

    def python_pids(self) -> list[int]:
        return [self._process.pid] if self._process is not None else []

    def mark(self) -> None:
        pass

    def check(self) -> None:
        if self.failed.value:
            raise RuntimeError(f"a {self.name} thread failed (its traceback is on stderr)")
        if self._process is not None and not self._process.is_alive():
            raise RuntimeError(f"the {self.name} process exited with {self._process.exitcode}")

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        self._process.join(STOP_TIMEOUT)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None
        if self.failed.value:
            raise RuntimeError(f"a {self.name} thread failed (its traceback is on stderr)")
        return {self.status: self.completed()}
