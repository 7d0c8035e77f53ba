"""The closed loop the end-to-end sides run in, and one measured window of a side.

A load generator keeps a fixed number of exports outstanding: it creates until that many are, then
asks which of the ones it created have ended, by their ids only (primary-key lookups, never a count
over the history), and creates one for each that ended. Its polls are its own reads, not the side's
work: it counts them, and the meter takes them off the side's transactions.

``measure`` starts a side, waits for its first completion, warms up, then reads the meter, samples
the completions every half second for the window, reads the meter again and stops the side.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench import meter

#: Seconds between the generator's polls when none of its exports has ended.
POLL_INTERVAL = 0.01
#: Seconds a side gets for its first completion (process start-up included), and to drain its backlog.
START_TIMEOUT = 120.0
DRAIN_TIMEOUT = 120.0
#: The statuses an export that ended well has, in each side's words.
SUCCESS = frozenset({"Completed", "succeeded", "successful", "done"})


class Queue(Protocol):
    """How a load generator creates an export on a side and learns which have ended."""

    def submit(self) -> Hashable: ...

    def ended(self, ids: list[Hashable]) -> Mapping[Hashable, str]:
        """The status of each of ``ids`` that has ended; one read."""
        ...

    def close(self) -> None: ...


class Generator:
    """Keeps ``backlog`` exports outstanding until stopped, in a thread of its own."""

    def __init__(self, queue: Queue, backlog: int) -> None:
        self.queue = queue
        self.backlog = backlog
        self.created: list[Hashable] = []
        self.statuses: Counter[str] = Counter()
        self.polls = 0
        self.failure: BaseException | None = None
        self._outstanding: dict[Hashable, None] = {}
        self._completed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-generator", daemon=True)

    def start(self) -> Generator:
        self._thread.start()
        return self

    @property
    def completed(self) -> int:
        with self._lock:
            return self._completed

    def _poll(self) -> bool:
        ended = self.queue.ended(list(self._outstanding))
        self.polls += 1
        good = 0
        for job, status in ended.items():
            if job in self._outstanding:
                del self._outstanding[job]
                self.statuses[status] += 1
                good += status in SUCCESS
        with self._lock:
            self._completed += good
        return bool(ended)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                while len(self._outstanding) < self.backlog:
                    job = self.queue.submit()
                    self.created.append(job)
                    self._outstanding[job] = None
                if not self._poll():
                    self._stop.wait(POLL_INTERVAL)
        except BaseException as exc:   # surfaced by check()
            self.failure = exc

    def check(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the load generator failed: {type(self.failure).__name__}: {self.failure}") \
                from self.failure

    def stop(self) -> dict[str, int]:
        """Stops creating, waits for every export it created to end; returns their statuses."""
        self._stop.set()
        self._thread.join()
        self.check()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while self._outstanding and time.monotonic() < deadline:
            if not self._poll():
                time.sleep(POLL_INTERVAL)   # polling a condition with a deadline
        statuses = dict(self.statuses)
        if self._outstanding:
            statuses["not ended after the run"] = len(self._outstanding)
        self.queue.close()
        return statuses


class Side(Protocol):
    """One way of running the end-to-end exports: ours, or a ceiling."""

    name: str

    def start(self) -> None: ...

    def completed(self) -> int:
        """Exports that ended well so far."""
        ...

    def generator_transactions(self) -> int: ...

    def python_pids(self) -> list[int]:
        """The roots of the side's Python processes (the load generator's excluded)."""
        ...

    def mark(self) -> None:
        """The measured window starts now."""
        ...

    def check(self) -> None:
        """Raises if a process of the side died or its loop failed."""
        ...

    def stop(self) -> dict[str, int]:
        """Stops the load, drains it; returns the statuses of every export of the run."""
        ...


@dataclass
class SideRun:
    name: str
    rate: float
    completed: int
    seconds: float
    costs: dict[str, float]
    statuses: dict[str, int]
    timeline: list[tuple[float, int]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def drift(self) -> float:
        return drift(self.timeline, self.seconds)


def drift(timeline: list[tuple[float, int]], seconds: float) -> float:
    """|rate in the last third - rate in the first third| / rate in the first third (the last and first
    minute in runs of three minutes or more)."""
    third = seconds / 3 if seconds < 180 else 60.0

    def rate_between(a: float, b: float) -> float:
        inside = [(t, c) for t, c in timeline if a <= t <= b]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    first, last = rate_between(0, third), rate_between(seconds - third, seconds)
    return abs(last - first) / first if first else float("nan")


def _wait(side: Side, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        side.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.name}: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.05)   # polling a condition with a deadline


def measure(side: Side, gauge: meter.Meter, *, warmup: float, seconds: float) -> SideRun:
    """One measured window of ``side`` (see the module's docstring)."""
    side.start()
    try:
        _wait(side, lambda: side.completed() > 0, START_TIMEOUT, "a first completed export")
        warm_until = time.monotonic() + warmup
        _wait(side, lambda: time.monotonic() >= warm_until, warmup + 60, "the warm-up")
        roots = {"python": side.python_pids()}
        before = gauge.read(roots)
        side.mark()
        done0, polls0 = side.completed(), side.generator_transactions()
        timeline = [(0.0, 0)]
        while (elapsed := time.monotonic() - before.at) < seconds:
            time.sleep(min(0.5, seconds - elapsed))   # a sampling interval, not a wait for a condition
            side.check()
            timeline.append((time.monotonic() - before.at, side.completed() - done0))
        after = gauge.read(roots)
        done, polls = side.completed() - done0, side.generator_transactions() - polls0
    except BaseException:
        side.stop()
        raise
    statuses = side.stop()
    window = after.at - before.at
    costs = meter.per_export(before, after, done, generator_transactions=polls)
    return SideRun(side.name, done / window, done, window, costs, statuses, timeline)


def idle(python_pids: list[int], gauge: meter.Meter, seconds: float) -> dict[str, float]:
    """The counters per second over ``seconds`` with no load."""
    roots = {"python": python_pids}
    before = gauge.read(roots)
    time.sleep(seconds)   # the measuring window
    return meter.per_second(before, gauge.read(roots))
