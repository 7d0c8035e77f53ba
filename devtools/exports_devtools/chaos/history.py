"""One job's history, ready for JSON: what the chaos checker attaches to each violation and the soak's
liveness watch reports for a stuck job."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from exports_devtools.chaos.partner import Partner
from exports_devtools.store import chaos as store

Row = dict[str, Any]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        return float(value)
    return value


def as_history(row: Row | None, events: Sequence[Row], outbox: Sequence[Row], cancellations: Sequence[Row],
               partner: Partner, default_dir: str) -> dict[str, Any]:
    own = elsewhere = None
    if row is not None:
        name = row["file_name"]
        own = partner.file(row["remote_dir"] or default_dir, name)
        elsewhere = [f.as_json() for f in partner.files(name) if f != own]
    return _jsonable({"row": row, "events": list(events), "outbox": list(outbox),
                      "cancellations": list(cancellations),
                      "partner_file": own.as_json() if own else None, "partner_files_elsewhere": elsewhere or []})


def job_history(conn: psycopg.Connection[Any], job_id: UUID, partner_root: Path, remote_dir: str) -> dict[str, Any]:
    """One job's history, ready for JSON: ``row`` (None if no such job; with its destination's
    ``remote_dir``), ``events`` in order, ``outbox`` rows, ``cancellations`` (its requests),
    ``partner_file`` (``path``, ``size``, ``sha256`` of its key's final file in its destination's
    directory, or None) and ``partner_files_elsewhere`` (the same name in ``remote_dir``, if that is
    another directory)."""
    row, events, outbox, cancellations = store.job_rows(conn, job_id)
    partner = Partner(partner_root, [remote_dir, row["remote_dir"] if row else None])
    return as_history(row, events, outbox, cancellations, partner, remote_dir)
