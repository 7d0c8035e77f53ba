"""A worker process's stop under any supervisor: the first stop signal starts the drain, later ones change
nothing, and a deadline, not a signal count, ends it.

Dramatiq's worker process stops gracefully on its first SIGTERM (or SIGHUP) and exits at once on the
second ("Killing worker process..."), mid-upload if one is running: an export left OutcomeUnknown until
evidence settles it. Under a supervisor a worker process is often signalled more than once. systemd's
default KillMode and honcho signal every process of the service, and Dramatiq's main process forwards
each signal it gets to every worker process, so each gets one directly and one forwarded; a second
``kill`` by an impatient operator, or a supervisor's repeated stop, does the same.

So in each worker process, once Dramatiq has installed its handlers (``after_process_boot``, on the
process's main thread), the first stop signal goes on to Dramatiq's handler, which starts its graceful
stop: no new messages; attempts still building stop and write nothing (``StopPreparationOnShutdown``;
recovery requeues them when their lease expires); uploads finish, for up to the stop timeout
(``EXPORTS_WORKER_STOP_SECONDS``, which ``exports worker`` passes to Dramatiq as
``--worker-shutdown-timeout``). Later signals are logged and ignored. Past the stop timeout Dramatiq
abandons what still runs (recovery resolves it from evidence once its lease expires); should the process
still be alive ``DEADLINE_GRACE_SECONDS`` after that (a shutdown hook waiting on a broker that went
away), a timer ends it. SIGKILL stays the supervisor's last word (systemd's ``TimeoutStopSec``).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import dramatiq

from app import logs

log = logs.get(__name__)

#: The signals a Dramatiq worker process stops on. It ignores SIGINT: its main process forwards that as
#: SIGTERM.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: Seconds past the stop timeout after which a stopping worker process ends itself, however far its
#: shutdown got.
DEADLINE_GRACE_SECONDS = 10.0
#: The exit status of a worker process its deadline ended: Dramatiq's own for a killed worker process.
EXIT_DEADLINE = 1

Handler = Callable[[int, FrameType | None], Any]


class Draining(dramatiq.Middleware):
    """Turns a worker process's stop signals into one drain with a deadline (see the module).

    Its handler runs on the main thread between two bytecodes of whatever that thread was doing, and
    a second signal runs it again in the middle of the first: so it takes no lock (the thread it
    interrupted may hold it, or the first run of the handler), decides which signal came first with
    one indivisible step (``next`` on a counter), and leaves the deadline to a thread started at boot."""

    def __init__(self, *, stop_seconds: float, in_flight: Callable[[], int],
                 exit_now: Callable[[int], None] = os._exit) -> None:
        self.stop_seconds = stop_seconds
        #: How many attempts this process holds (claimed, their last write not yet made); takes no lock.
        self.in_flight = in_flight
        self._exit_now = exit_now
        self._signals = itertools.count()
        #: Set by the first stop signal; the deadline counts from then.
        self.stopping = threading.Event()
        self.stopping_since: float | None = None

    @property
    def deadline_seconds(self) -> float:
        return self.stop_seconds + DEADLINE_GRACE_SECONDS

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        if threading.current_thread() is not threading.main_thread():
            return   # only a main thread may set handlers; a Dramatiq worker process boots on its own
        self.start_deadline()
        for sig in STOP_SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):   # Dramatiq's; a default or ignored disposition is left as it is
                signal.signal(sig, self.wrap(previous))

    def wrap(self, previous: Handler) -> Handler:
        """The handler that passes the first stop signal to ``previous`` and ignores the rest."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.begin(signal.Signals(signum)):
                previous(signum, frame)

        return handle

    def begin(self, sig: signal.Signals) -> bool:
        """True for the first stop signal, which starts the deadline; False (logged) for every later one."""
        if next(self._signals) == 0:
            self.stopping_since = time.monotonic()
            self.stopping.set()
            log.info("worker.draining", signal=sig.name, attempts=self.in_flight(),
                     uploads_may_take_seconds=self.stop_seconds, ends_within_seconds=self.deadline_seconds)
            return True
        since = self.stopping_since
        log.info("worker.stop_signal_ignored", signal=sig.name, attempts=self.in_flight(),
                 draining_for_seconds=None if since is None else round(time.monotonic() - since, 1))
        return False

    def start_deadline(self) -> None:
        """Starts the thread that ends the process ``deadline_seconds`` after the first stop signal."""
        threading.Thread(target=self._deadline, name="exports-stop-deadline", daemon=True).start()

    def _deadline(self) -> None:
        self.stopping.wait()
        time.sleep(self.deadline_seconds)
        log.error("worker.stop_deadline_passed", seconds=self.deadline_seconds, attempts=self.in_flight())
        self._exit_now(EXIT_DEADLINE)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # Dramatiq waited the stop timeout for its threads and went on: what is still held is abandoned.
        left = self.in_flight()
        if left:
            log.warning("worker.stopped_with_attempts_in_flight", attempts=left,
                        stop_seconds=self.stop_seconds, resolved_by="recovery, once their leases expire")
