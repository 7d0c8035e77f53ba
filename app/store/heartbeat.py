"""Process heartbeats, one function per statement in ``sql/heartbeat.sql``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from app.store import connector


@dataclass(frozen=True)
class ProcessIdentity:
    process_id: str
    role: str
    host: str
    pid: int
    version: str
    started_at: datetime
    #: The process to signal when it is not this one: a worker process's ``exports worker``; None otherwise.
    parent_pid: int | None = None


@dataclass(frozen=True)
class ProcessRecord:
    identity: ProcessIdentity
    beat_at: datetime
    stopped_at: datetime | None
    silent_seconds: float
    #: For a worker, the attempts it holds now (Running or Delivering, claimed by this process).
    attempts: tuple[UUID, ...]


def beat(conn: psycopg.Connection, identity: ProcessIdentity) -> bool:
    """Records that the process is alive; False when it was recorded as stopped (nothing changes)."""
    return connector.execute(conn, "heartbeat_beat", dict(
        process_id=identity.process_id, role=identity.role, host=identity.host, pid=identity.pid,
        version=identity.version, started_at=identity.started_at, parent_pid=identity.parent_pid)) == 1


def stop(conn: psycopg.Connection, identity: ProcessIdentity) -> bool:
    return connector.execute(conn, "heartbeat_stop", dict(
        process_id=identity.process_id, started_at=identity.started_at)) == 1


def processes(conn: psycopg.Connection) -> list[ProcessRecord]:
    return [ProcessRecord(
        identity=ProcessIdentity(r["process_id"], r["role"], r["host"], r["pid"], r["version"], r["started_at"],
                                 r["parent_pid"]),
        beat_at=r["beat_at"], stopped_at=r["stopped_at"], silent_seconds=float(r["silent_seconds"]),
        attempts=tuple(r["attempts"]))
        for r in connector.fetch_all(conn, "heartbeat_list")]


def prune(conn: psycopg.Connection, *, retention_seconds: float, silent_seconds: float, batch_size: int) -> int:
    """One batch: drops the rows of processes that stopped more than ``retention_seconds`` ago, or went
    silent (no beat for ``silent_seconds``) that long ago; returns how many it dropped."""
    return connector.execute(conn, "heartbeat_prune", dict(
        retention_seconds=retention_seconds, silent_seconds=silent_seconds, batch_size=batch_size))
