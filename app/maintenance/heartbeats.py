"""Heartbeat pruning: the scheduler forgets the processes dead for longer than the retention, so
``process_heartbeats`` holds the processes of the last days rather than every one that ever ran, and
``exports processes`` lists them.

A process is dead once it stopped (a clean shutdown) or went silent (no beat for ``SILENT_INTERVALS``
heartbeat intervals), as ``exports processes`` and ``exports health`` judge it; its row goes once it has
been dead for ``EXPORTS_HEARTBEAT_RETENTION_SECONDS``. A live process is never pruned, and one that beats
again after its row went is simply recorded again. Batch by batch through ``app/store/heartbeat.py``'s
conditional statement (``FOR UPDATE SKIP LOCKED``, re-checking the death), so any number of schedulers
may prune at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from app import logs
from app.config import ConfigError, Settings
from app.heartbeat import SILENT_INTERVALS
from app.store import heartbeat
from app.store.database import Database

log = logs.get(__name__)

#: Seconds between the scheduler's runs: rows stay for days, so once an hour is plenty.
PRUNE_INTERVAL_SECONDS = 3600.0
#: Rows one statement deletes.
DEFAULT_BATCH = 500


@dataclass(frozen=True)
class PruneConfig:
    retention_seconds: float
    #: How long a process may go without a beat before it counts as dead.
    silent_seconds: float
    batch_size: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if not self.retention_seconds > 0 or not self.silent_seconds > 0:
            raise ConfigError("retention_seconds and silent_seconds must be positive")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of at least 1, not {self.batch_size!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> PruneConfig:
        return cls(retention_seconds=settings.heartbeat_retention_seconds,
                   silent_seconds=SILENT_INTERVALS * settings.heartbeat_seconds)


@dataclass(frozen=True)
class PruneCounts:
    pruned: int = 0
    batches: int = 0


class HeartbeatPruner:
    """Deletes the heartbeat rows of processes dead for longer than the retention, batch by batch until
    a batch comes back short; each batch is its own short statement. ``db`` runs as exports_app."""

    def __init__(self, db: Database, config: PruneConfig):
        self.db = db
        self.config = config

    def run_once(self) -> PruneCounts:
        pruned = batches = 0
        while True:
            with self.db.connection() as conn:
                deleted = heartbeat.prune(conn, retention_seconds=self.config.retention_seconds,
                                          silent_seconds=self.config.silent_seconds,
                                          batch_size=self.config.batch_size)
            batches += 1
            pruned += deleted
            if deleted < self.config.batch_size:
                break
        if pruned:
            log.info("heartbeats.pruned", pruned=pruned, batches=batches,
                     retention_seconds=self.config.retention_seconds)
        return PruneCounts(pruned=pruned, batches=batches)
