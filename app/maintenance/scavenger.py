"""The scavenger: deletes local export files that no attempt can use any more.

A worker removes its own file after its last write; this catches the files whose removal failed or
never ran (a crash, a kill). It reads which attempt each file's job is on (``app/store/scavenger.py``)
and deletes only regular files named like the builder's whose attempt has ended, or that match no job
once they are older than a grace period.
"""

from __future__ import annotations

import enum
import re
import stat as stat_module
import time
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

from app import logs
from app.config import ConfigError, Settings
from app.store import scavenger
from app.store.database import Database
from app.store.scavenger import AttemptState
from app.store.types import Status

log = logs.get(__name__)

#: Seconds a local file that matches no job is kept before the scavenger deletes it.
DEFAULT_ORPHAN_GRACE_SECONDS = 24 * 3600.0
#: Job ids per lookup when the scavenger ties files to attempts.
SCAVENGE_LOOKUP_BATCH = 500


#: The builder's names: ``{job_id}.{attempt_id}.csv``, and ``.csv.part`` while it writes.
EXPORT_FILE = re.compile(
    r"^(?P<job>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\."
    r"(?P<attempt>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.csv(?:\.part)?$")


@dataclass(frozen=True)
class ScavengerConfig:
    work_dir: Path
    orphan_grace_seconds: float = DEFAULT_ORPHAN_GRACE_SECONDS

    def __post_init__(self) -> None:
        if not self.orphan_grace_seconds > 0:
            raise ConfigError(f"orphan_grace_seconds must be positive, not {self.orphan_grace_seconds!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> ScavengerConfig:
        return cls(work_dir=settings.work_dir)


class FileFate(enum.Enum):
    KEEP = "keep"                    # its attempt is still Running or Delivering
    ATTEMPT_ENDED = "attempt_ended"  # its job moved on: the attempt can never use it again
    ORPHAN = "orphan"                # no job has its id, and it is older than the grace period
    YOUNG_ORPHAN = "young_orphan"    # no job has its id yet; kept for the grace period


@dataclass(frozen=True)
class ScavengeCounts:
    examined: int = 0
    deleted: int = 0
    kept: int = 0
    failed: int = 0


@dataclass(frozen=True)
class _ExportFile:
    path: Path
    job_id: UUID
    attempt_id: UUID
    mtime: float = field(compare=False)


def decide_file(file: _ExportFile, job: AttemptState | None, *, now: float, grace_seconds: float) -> FileFate:
    if job is None:
        return FileFate.ORPHAN if now - file.mtime > grace_seconds else FileFate.YOUNG_ORPHAN
    current = job.attempt_id == file.attempt_id and job.status in (Status.RUNNING, Status.DELIVERING)
    return FileFate.KEEP if current else FileFate.ATTEMPT_ENDED


class Scavenger:
    """Deletes local export files whose attempt has ended (the worker's own removal failed or never
    ran), and files that match no job once they are older than a grace period. Touches nothing that
    is not a regular file named like the builder's."""

    def __init__(self, db: Database, config: ScavengerConfig):
        self.db = db
        self.config = config

    def run_once(self) -> ScavengeCounts:
        files = self._export_files()
        if not files:
            return ScavengeCounts()
        jobs = self._jobs({f.job_id for f in files})
        now = time.time()
        deleted = kept = failed = 0
        for file in files:
            fate = decide_file(file, jobs.get(file.job_id), now=now, grace_seconds=self.config.orphan_grace_seconds)
            if fate in (FileFate.KEEP, FileFate.YOUNG_ORPHAN):
                kept += 1
                continue
            try:
                file.path.unlink()
            except FileNotFoundError:
                continue   # the worker removed it meanwhile: nothing left to do
            except OSError as exc:
                failed += 1
                log.warning("scavenger.delete_failed", job_id=file.job_id, attempt_id=file.attempt_id,
                            file=file.path.name, reason=fate.value, error=type(exc).__name__)
                continue
            deleted += 1
            log.info("scavenger.deleted", job_id=file.job_id, attempt_id=file.attempt_id, file=file.path.name,
                     reason=fate.value)
        counts = ScavengeCounts(examined=len(files), deleted=deleted, kept=kept, failed=failed)
        if deleted or failed:
            log.info("scavenger.run", examined=counts.examined, deleted=deleted, kept=kept, failed=failed)
        return counts

    def _export_files(self) -> list[_ExportFile]:
        try:
            entries = list(self.config.work_dir.iterdir())
        except FileNotFoundError:
            return []
        files = []
        for path in entries:
            match = EXPORT_FILE.match(path.name)
            if match is None:
                continue
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if not stat_module.S_ISREG(info.st_mode):
                continue   # a symlink or directory named like an export is not ours to delete
            files.append(_ExportFile(path, UUID(match["job"]), UUID(match["attempt"]), info.st_mtime))
        return sorted(files, key=lambda f: f.path.name)

    def _jobs(self, job_ids: set[UUID]) -> dict[UUID, AttemptState]:
        found: dict[UUID, AttemptState] = {}
        ids = sorted(job_ids)
        with self.db.connection() as conn:
            for start in range(0, len(ids), SCAVENGE_LOOKUP_BATCH):
                found.update(scavenger.read_attempts(conn, ids[start:start + SCAVENGE_LOOKUP_BATCH]))
        return found
