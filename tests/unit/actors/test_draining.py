"""A worker process's stop signals (app/actors/draining.py): the first reaches Dramatiq's handler and starts
the deadline, every later one is ignored, one arriving inside the first handler's run included (a
handler that took a lock there would wait for itself forever), and the deadline ends the process the
stop timeout plus the grace after the first. The whole stop, mid-upload, as supervisors send it:
tests/acceptance/test_worker_stops.py."""

from __future__ import annotations

import signal
import threading

from app.actors import draining
from app.actors.draining import EXIT_DEADLINE, Draining


class Exit:
    def __init__(self) -> None:
        self.code: int | None = None
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.code = code
        self.called.set()


def test_the_first_stop_signal_reaches_dramatiqs_handler_and_every_later_one_is_ignored():
    calls = []
    stop = Draining(stop_seconds=30, in_flight=lambda: 1, exit_now=Exit())
    handle = stop.wrap(lambda signum, frame: calls.append(signum))
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP, signal.SIGTERM):
        handle(sig, None)
    assert calls == [signal.SIGTERM]
    assert stop.stopping.is_set() and stop.stopping_since is not None


def test_a_signal_that_arrives_while_the_first_is_being_handled_is_ignored_without_waiting_on_it():
    calls = []
    stop = Draining(stop_seconds=30, in_flight=lambda: 0, exit_now=Exit())

    def dramatiqs(signum, frame):
        calls.append(signum)
        handle(signal.SIGTERM, None)   # the second signal, run between two bytecodes of the first handler

    handle = stop.wrap(dramatiqs)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (handle(signal.SIGTERM, None), done.set()), daemon=True)
    worker.start()
    assert done.wait(10), "the second signal waited on the first"
    assert calls == [signal.SIGTERM]


def test_the_deadline_ends_the_process_the_stop_timeout_and_the_grace_after_the_first_signal(monkeypatch):
    monkeypatch.setattr(draining, "DEADLINE_GRACE_SECONDS", 0.05)
    exit_now = Exit()
    stop = Draining(stop_seconds=0.05, in_flight=lambda: 1, exit_now=exit_now)
    stop.start_deadline()
    assert not exit_now.called.is_set()   # no signal yet, no deadline
    assert stop.deadline_seconds == 0.1
    stop.begin(signal.SIGTERM)
    assert exit_now.called.wait(10)
    assert exit_now.code == EXIT_DEADLINE
