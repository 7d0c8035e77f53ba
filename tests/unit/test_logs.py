"""The one log style: an event name and its fields, rendered the same in every process."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from app import logs


@pytest.fixture
def captured():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)

    def configure(fmt: str) -> io.StringIO:
        logs.configure(fmt, stream=stream)
        return stream

    yield configure
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_an_event_is_its_name_then_its_fields_as_key_value_text(captured):
    stream = captured("text")
    job_id = uuid.uuid4()

    logs.get("app.test").info("runner.claimed", job_id=job_id, attempt=2)

    line = stream.getvalue().strip()
    assert line.split(" ")[2:] == ["INFO", "app.test", "runner.claimed", f"job_id={job_id}", "attempt=2"]


def test_the_json_format_is_one_object_per_line_with_the_fields_beside_the_event(captured):
    stream = captured("json")
    job_id = uuid.uuid4()

    logs.get("app.test").warning("relay.broker_unavailable", job_id=job_id, error="ConnectionError")

    record = json.loads(stream.getvalue())
    assert {k: record[k] for k in ("level", "logger", "event", "job_id", "error")} == {
        "level": "WARNING", "logger": "app.test", "event": "relay.broker_unavailable", "job_id": str(job_id),
        "error": "ConnectionError"}


def test_a_library_record_without_fields_is_rendered_with_its_message_as_the_event(captured):
    stream = captured("json")

    logging.getLogger("dramatiq.worker").info("Worker process is ready for action.")

    assert json.loads(stream.getvalue())["event"] == "Worker process is ready for action."


def test_an_unknown_format_is_refused_with_the_formats_it_knows():
    with pytest.raises(ValueError, match="text, json"):
        logs.formatter("xml")


# --- fields bound once, for every event of a job -------------------------------------------------


def _events(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_bound_fields_appear_on_every_event_of_any_module_in_the_block_as_json_fields(captured):
    stream = captured("json")
    job_id, attempt_id = uuid.uuid4(), uuid.uuid4()

    with logs.bound(job_id=job_id, attempt_id=attempt_id):
        logs.get("app.actors.runner").info("runner.claimed", worker_id="host:1:2")
        logs.get("app.delivery.destination").warning("delivery.unreachable", error="ConnectionRefusedError")
    logs.get("app.actors.runner").info("runner.idle")

    claimed, unreachable, after = _events(stream)
    assert {k: claimed[k] for k in ("event", "job_id", "attempt_id", "worker_id")} == {
        "event": "runner.claimed", "job_id": str(job_id), "attempt_id": str(attempt_id), "worker_id": "host:1:2"}
    assert (unreachable["logger"], unreachable["job_id"], unreachable["attempt_id"]) == (
        "app.delivery.destination", str(job_id), str(attempt_id))
    assert "job_id" not in after and "attempt_id" not in after


def test_bound_fields_come_first_in_the_text_format_then_the_events_own(captured):
    stream = captured("text")
    job_id = uuid.uuid4()

    with logs.bound(job_id=job_id):
        logs.get("app.test").info("delivery.baseline", present=False)

    assert stream.getvalue().strip().split(" ")[2:] == [
        "INFO", "app.test", "delivery.baseline", f"job_id={job_id}", "present=False"]


def test_a_nested_binding_adds_to_the_outer_one_and_leaving_it_restores_the_outer_one(captured):
    stream = captured("json")
    job_id, attempt_id = uuid.uuid4(), uuid.uuid4()
    log = logs.get("app.test")

    with logs.bound(job_id=job_id):
        with logs.bound(attempt_id=attempt_id):
            log.info("inner")
        log.info("outer")

    inner, outer = _events(stream)
    assert (inner["job_id"], inner["attempt_id"]) == (str(job_id), str(attempt_id))
    assert outer["job_id"] == str(job_id) and "attempt_id" not in outer


def test_a_nested_binding_of_the_same_field_shadows_it_only_inside(captured):
    stream = captured("json")
    log = logs.get("app.test")

    with logs.bound(job_id="outer-job"):
        with logs.bound(job_id="inner-job"):
            log.info("inner")
        log.info("outer")

    assert [e["job_id"] for e in _events(stream)] == ["inner-job", "outer-job"]


def test_the_binding_ends_with_its_block_even_when_the_block_raises(captured):
    stream = captured("json")

    with pytest.raises(RuntimeError), logs.bound(job_id="job-1"):
        raise RuntimeError("the attempt failed")
    logs.get("app.test").info("next")

    assert "job_id" not in _events(stream)[0]


@pytest.mark.parametrize("fmt", logs.FORMATS)
def test_an_explicit_field_wins_over_a_bound_one_in_either_format(captured, fmt):
    stream = captured(fmt)

    with logs.bound(job_id="bound-job", attempt_id="bound-attempt"):
        logs.get("app.test").info("watcher.stop_confirmed", attempt_id="explicit-attempt")

    line = stream.getvalue().strip()
    if fmt == "json":
        event = json.loads(line)
        assert (event["job_id"], event["attempt_id"]) == ("bound-job", "explicit-attempt")
    else:
        assert line.split(" ")[4:] == ["watcher.stop_confirmed", "job_id=bound-job", "attempt_id=explicit-attempt"]


def test_another_thread_does_not_see_the_binding_unless_it_runs_in_a_deliberately_copied_context(captured):
    stream = captured("json")
    log = logs.get("app.test")

    with logs.bound(job_id="job-1"):
        plain = threading.Thread(target=log.info, args=("in_a_new_thread",))
        copied = threading.Thread(target=contextvars.copy_context().run, args=(log.info, "in_a_copied_context"))
        for thread in (plain, copied):
            thread.start()
            thread.join()

    by_event = {e["event"]: e for e in _events(stream)}
    assert "job_id" not in by_event["in_a_new_thread"]
    assert by_event["in_a_copied_context"]["job_id"] == "job-1"


def test_a_binding_made_in_another_thread_never_reaches_this_one(captured):
    stream = captured("json")
    inside, release = threading.Event(), threading.Event()

    def attempt() -> None:
        with logs.bound(job_id="other-job"):
            inside.set()
            release.wait(5)

    other = threading.Thread(target=attempt)
    other.start()
    try:
        assert inside.wait(5)
        logs.get("app.test").info("here")   # while the other thread's binding is still in force
    finally:
        release.set()
        other.join()

    assert "job_id" not in _events(stream)[0]


def test_a_library_record_logged_inside_a_binding_carries_the_bound_fields(captured):
    stream = captured("json")
    job_id = uuid.uuid4()

    with logs.bound(job_id=job_id, message_id="m-1"):
        logging.getLogger("dramatiq.middleware.retries").warning("Retrying message %r.", "m-1")
    logging.getLogger("dramatiq.middleware.retries").warning("outside")

    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (inside["event"], inside["job_id"], inside["message_id"]) == ("Retrying message 'm-1'.", str(job_id), "m-1")
    assert "job_id" not in outside


def test_bind_and_unbind_open_and_close_a_binding_in_two_calls(captured):
    stream = captured("json")
    token = logs.bind(message_id="m-2")
    assert logs.current() == {"message_id": "m-2"}
    logs.get("app.test").info("dedup.skipped")
    logs.unbind(token)
    logs.get("app.test").info("after")

    during, after = (json.loads(line) for line in stream.getvalue().splitlines())
    assert during["message_id"] == "m-2" and "message_id" not in after
    assert logs.current() == {}


def test_a_process_routing_uncaught_errors_writes_warnings_and_a_threads_traceback_as_json_lines_only():
    script = """
import threading, warnings
from app import logs
logs.configure("json")
logs.route_uncaught()
warnings.warn("a library's deprecation")
thread = threading.Thread(target=lambda: 1 / 0, name="doomed")
thread.start()
thread.join()
raise RuntimeError("the main thread's surprise")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout == "" and done.returncode == 1
    records = [json.loads(line) for line in done.stderr.splitlines()]   # every line one JSON object
    assert [(r["level"], r["event"]) for r in records][1:] == [
        ("ERROR", "thread.uncaught_exception"), ("CRITICAL", "process.uncaught_exception")]
    assert "a library's deprecation" in records[0]["event"] and records[0]["logger"] == "py.warnings"
    assert records[1]["thread"] == "doomed" and "ZeroDivisionError" in records[1]["exception"]
    assert "the main thread's surprise" in records[2]["exception"]
