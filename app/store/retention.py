"""Outbox retention: published rows older than the retention period are archived, then deleted, as
``exports_retention``; an unpublished row is never touched (the statement never selects one, and the
outbox trigger refuses its deletion to everyone).

The history tables (``export_attempt_events``, ``cancellation_requests``, ``deliveries``) are the audit
trail and are kept: nothing here deletes from them, and their triggers refuse it.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.store import connector
from app.store.database import connect
from app.store.types import Role

#: Rows archived and deleted per transaction.
DEFAULT_BATCH = 5_000


@dataclass(frozen=True)
class Archived:
    rows: int
    files: tuple[Path, ...]


def archive_published(url: str, *, older_than_seconds: float, archive_dir: Path,
                      batch_size: int = DEFAULT_BATCH) -> Archived:
    """Deletes published outbox rows older than ``older_than_seconds``, batch by batch. Each batch is
    written to its own gzipped JSON-lines file in ``archive_dir``, closed and fsynced before the
    batch's transaction commits, so a deleted row is always in an archive file. ``url`` must be a login
    that may ``SET ROLE exports_retention``."""
    archive_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    files: list[Path] = []
    rows = 0
    with connect(url, Role.RETENTION, application_name="exports-retention") as conn:
        while True:
            with conn.transaction():
                deleted = connector.fetch_all(conn, "retention_delete_published", dict(
                    older_than_seconds=older_than_seconds, batch_size=batch_size))
                if deleted:
                    files.append(_write(archive_dir / f"outbox-{stamp}-{os.getpid()}-{len(files) + 1:05d}.jsonl.gz",
                                        deleted))
            rows += len(deleted)
            if len(deleted) < batch_size:
                return Archived(rows, tuple(files))


def _write(path: Path, rows: list[dict]) -> Path:
    partial = path.with_name(path.name + ".part")
    with open(partial, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb") as archive:
            for row in rows:
                archive.write((json.dumps({k: None if v is None else str(v) for k, v in row.items()}) + "\n").encode())
        raw.flush()
        os.fsync(raw.fileno())
    partial.rename(path)
    return path
