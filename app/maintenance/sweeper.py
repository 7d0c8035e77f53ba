"""The sweeper: a backstop for wake-ups lost between the outbox, the broker and the worker.

It writes a fresh outbox row for every job left Queued longer than the threshold, batch by batch,
through ``app/store/sweeper.py``'s conditional statement (``FOR UPDATE SKIP LOCKED``, re-checking
Queued), so any number of schedulers may sweep at once. Exports of a paused tenant or destination are left:
their resume wakes them. Each pass also pauses the draining destinations whose last attempt has ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from app import logs
from app.config import ConfigError, Settings
from app.store import pausing, sweeper
from app.store.database import Database

log = logs.get(__name__)


@dataclass(frozen=True)
class SweeperConfig:
    sweep_after_seconds: float
    batch_size: int

    def __post_init__(self) -> None:
        if not self.sweep_after_seconds > 0:
            raise ConfigError(f"sweep_after_seconds must be positive, not {self.sweep_after_seconds!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of at least 1, not {self.batch_size!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> SweeperConfig:
        return cls(sweep_after_seconds=settings.sweep_after_seconds, batch_size=settings.sweep_batch_size)


@dataclass(frozen=True)
class SweepCounts:
    republished: int = 0
    batches: int = 0
    #: Draining destinations paused by this pass: none of their attempts runs any more.
    drained: int = 0


class Sweeper:
    """Republishes Queued jobs whose last wake-up is older than the threshold, batch by batch until
    a batch comes back short; each batch is its own short statement."""

    def __init__(self, db: Database, config: SweeperConfig):
        self.db = db
        self.config = config

    def run_once(self) -> SweepCounts:
        republished = batches = 0
        while True:
            with self.db.connection() as conn:
                jobs = sweeper.republish_due(conn, sweep_after_seconds=self.config.sweep_after_seconds,
                                              batch_size=self.config.batch_size)
            batches += 1
            republished += len(jobs)
            for job in jobs:
                log.info("sweeper.republished", tenant_id=job.tenant_id, job_id=job.job_id, message_id=job.message_id)
            if len(jobs) < self.config.batch_size:
                break
        with self.db.connection() as conn:
            drained = pausing.settle_drains(conn)
        for destination_id in drained:
            log.info("sweeper.drained", destination_id=destination_id)
        counts = SweepCounts(republished=republished, batches=batches, drained=len(drained))
        if republished or drained:
            log.info("sweeper.run", republished=republished, batches=batches, drained=len(drained))
        return counts
