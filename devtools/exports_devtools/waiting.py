"""Waiting for a fact about a running system, with a bound: the one poll loop of the demo and the tests.

A test or a scene never sleeps for a guessed time; it names the condition it waits for and how long
that may take, and a condition that does not hold in time is a failure that says what was awaited:

    wait_until(lambda: status(job) == "Completed", f"export {job} to be Completed", timeout=60)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds a wait may take when the caller does not say: ample for a condition that is about to hold.
TIMEOUT = 10.0
#: Seconds between two looks at the condition.
INTERVAL = 0.02


class TimedOut(AssertionError):
    """Raised when a condition did not hold within its bound. An AssertionError, so that pytest reports
    it as a failed expectation, with ``what`` and the diagnostics in its message."""


def wait_until(condition: Callable[[], T], what: str, timeout: float = TIMEOUT, *, interval: float = INTERVAL,
               diagnostics: Callable[[], str] = lambda: "") -> T:
    """Calls ``condition`` until it returns a truthy value, and returns that value; raises ``TimedOut``
    naming ``what`` (and ``diagnostics()``, when given) once ``timeout`` seconds have passed. An exception
    from ``condition`` ends the wait at once: a condition can refuse to wait on a system that died."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            details = diagnostics()
            raise TimedOut(f"timed out after {timeout:g}s waiting for {what}" + (f"\n{details}" if details else ""))
        time.sleep(interval)
