"""The one log style: an event name and its fields, rendered the same in every process."""

from __future__ import annotations

import io
import json
import logging
import uuid

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
