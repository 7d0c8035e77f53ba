"""Human output by default, one JSON document with --json; errors are one line on stderr either way."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from enum import Enum
from typing import Any
from uuid import UUID

from app.cli.common import Context, UsageError, printable


def _default(value: Any) -> Any:
    if isinstance(value, (UUID, Enum)):
        return value.value if isinstance(value, Enum) else str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def to_json(data: Any) -> str:
    return json.dumps(data, default=_default, sort_keys=False)


def emit(ctx: Context, human: str, data: Any) -> None:
    sys.stdout.write((to_json(data) if ctx.json else human) + "\n")
    sys.stdout.flush()


def error(ctx: Context | None, code: int, message: str, data: dict[str, Any] | None = None) -> None:
    """One line on stderr, never stdout: text, or with --json one JSON object a script can parse."""
    if ctx is not None and ctx.json:
        sys.stderr.write(to_json({"error": message, "exit_code": code, **(data or {})}) + "\n")
    else:
        sys.stderr.write(f"exports: error: {printable(message, 500)}\n")
    sys.stderr.flush()


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()[:12]
    return printable(str(value), 80)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def usage(exc: UsageError, *, json: bool) -> None:
    """A usage error, before any handler ran: argparse's one line as it says it, or one JSON object."""
    if json:
        sys.stderr.write(to_json({"error": exc.message, "exit_code": exc.code}) + "\n")
    else:
        sys.stderr.write(exc.message + "\n")
    sys.stderr.flush()
