"""One log style for every process: an event name and its fields.

    log = logs.get(__name__)
    log.info("runner.claimed", job_id=job.id, attempt_id=attempt_id)

The event name says what happened (``<component>.<what>``); the fields say to what, so one job can be
followed across relay, workers and scheduler by ``job_id``, ``attempt_id`` and ``message_id``. The
fields travel on the record as ``record.fields``; the formatters render them as ``key=value`` text or
as one JSON object per line (``EXPORTS_LOG_FORMAT=json``), the same in every process. Records from
libraries (Dramatiq, APScheduler, paramiko) go through the same formatter, their message as the event.

A job's ids are bound once where they become known, not repeated in every call:

    with logs.bound(job_id=job.id):
        ...   # every event logged here, by any module, carries job_id; explicit fields win

The binding lives in a ``ContextVar``, so it belongs to the thread (or asyncio task) that made it
and ends with its ``with`` block. A new thread starts without it: one that works for a job binds
again what was bound where the work was handed to it (``current()``: the lease keeper's renewals and
the stop watcher do), or runs in ``contextvars.copy_context()``. The ids of one export are
``tenant_id``, ``job_id``, ``attempt_id`` and ``message_id`` (the wake-up being processed). Records
from libraries (Dramatiq's retries, psycopg's pool) get the binding of the thread that logs them as
their fields (``BindingFilter``); many are written where no job is bound (paramiko's transport thread,
APScheduler's executor) and carry none.

Nothing secret is ever passed as a field: the callers pass ids, counts, states and error classes.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from enum import Enum
from types import MappingProxyType
from typing import Any, TextIO
from uuid import UUID

#: The formats ``configure`` accepts.
FORMATS = ("text", "json")
#: Libraries whose INFO lines are noise at our scale (APScheduler logs every run of every job).
QUIET = {"apscheduler": logging.WARNING, "pika": logging.WARNING, "paramiko": logging.WARNING}
#: The fields bound in this context (``bound``); replaced, never mutated, so a copied context keeps its own.
_BOUND: ContextVar[Mapping[str, Any]] = ContextVar("exports_log_fields", default=MappingProxyType({}))


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Adds ``fields`` to every event logged in this context until the block ends, over any bound
    outside it; leaving the block restores the outer binding."""
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def bind(**fields: Any) -> Token[Mapping[str, Any]]:
    """``bound`` for hooks that open and close in two calls (Dramatiq's before and after a message): adds
    ``fields`` until ``unbind(token)``, which must run in the same context (the same thread)."""
    return _BOUND.set({**_BOUND.get(), **fields})


def unbind(token: Token[Mapping[str, Any]]) -> None:
    _BOUND.reset(token)


def current() -> Mapping[str, Any]:
    """The fields bound here now: for a thread that works for the same job later (a lease renewal, the
    stop watcher) to bind them again there."""
    return _BOUND.get()


class EventLogger:
    """A logger whose keyword arguments are the event's fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def _log(self, level: int, event: str, exc_info: Any, fields: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(level):
            # Merged when the event happens, in the context that logs it: a handler may format it later.
            fields = {**_BOUND.get(), **fields}
            self.logger.log(level, event, exc_info=exc_info, extra={"fields": fields}, stacklevel=3)

    def debug(self, event: str, *, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.DEBUG, event, exc_info, fields)

    def info(self, event: str, *, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.INFO, event, exc_info, fields)

    def warning(self, event: str, *, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.WARNING, event, exc_info, fields)

    def error(self, event: str, *, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.ERROR, event, exc_info, fields)

    def critical(self, event: str, *, exc_info: Any = None, **fields: Any) -> None:
        self._log(logging.CRITICAL, event, exc_info, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, True, fields)


def get(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    return dict(getattr(record, "fields", None) or {})


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (UUID, datetime)):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    """``2026-12-01T10:00:00.123+00:00 4242 INFO app.actors.runner runner.claimed job_id=... attempt_id=...``"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), str(record.process), record.levelname, record.name, record.getMessage()]
        parts += [f"{key}={_plain(value)}" for key, value in fields_of(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``pid``, ``event`` and the fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name,
                                   "pid": record.process, "event": record.getMessage()}
        for key, value in fields_of(record).items():
            payload.setdefault(key, _plain(value))
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, separators=(",", ":"))


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


class BindingFilter(logging.Filter):
    """Gives a library's record (one not logged through ``EventLogger``) the fields bound where it is
    logged: a handler runs on the logging thread, so the binding is that thread's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "fields"):
            record.fields = dict(_BOUND.get())
        return True


def route_uncaught() -> None:
    """For a long-running process: Python's warnings and uncaught exceptions (a thread's, the main
    thread's) become log records, in the process's format, instead of plain text on stderr that would
    break a JSON log's one-object-per-line."""
    logging.captureWarnings(True)
    uncaught = logging.getLogger("uncaught")

    def main_thread(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        uncaught.critical("process.uncaught_exception", exc_info=(kind, value, tb))

    def thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit and args.exc_value is not None:
            uncaught.error("thread.uncaught_exception", exc_info=args.exc_value,
                           extra={"fields": {"thread": args.thread.name if args.thread else None}})

    sys.excepthook = main_thread
    threading.excepthook = thread


def configure(fmt: str = "text", level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Sends every record of this process to ``stream`` (stderr) in ``fmt``, replacing any handler a
    library installed on the root logger (Dramatiq's worker installs its own)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(BindingFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name, quiet_level in QUIET.items():
        logging.getLogger(name).setLevel(max(level, quiet_level))
