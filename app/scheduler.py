"""The scheduler process: recovery, the sweeper and the scavenger, each a service with a validated
config and a ``run_once()`` that returns counts, run by APScheduler at its interval.

Every write is one of the conditional statements in ``app/store/recovery.py``: a scan or a read only
nominates, and the statement repeats every condition the decision relied on. So any number of
schedulers can run at once: of two that decide the same takeover, one write matches and the other
matches nothing, and nothing is recorded twice.

Recovery resolves an expired Delivering attempt only from evidence (``decide_delivery``): Completed
when the destination, or a receipt the attempt appended, shows the expected file; OutcomeUnknown
otherwise. Never Failed from an absent file: a paused worker can outlast any timeout.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import re
import stat as stat_module
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, assert_never
from uuid import UUID

import peewee
import psycopg
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler

from app.actors.destination import Destination, DestinationConfig, Evidence, EvidenceStage, ExpectedFile, Listing, Proof
from app.config import Settings
from app.store import jobs as job_store
from app.store import models, recovery
from app.store.database import Database
from app.store.recovery import ExpiredAttempt
from app.store.types import EventKind, Role, Status

log = logging.getLogger(__name__)

#: Expired attempts one recovery scan nominates.
DEFAULT_RECOVERY_BATCH = 100
#: OutcomeUnknown jobs one reconciliation page reads.
DEFAULT_RECONCILE_BATCH = 200
#: Seconds a local file that matches no job is kept before the scavenger deletes it.
DEFAULT_ORPHAN_GRACE_SECONDS = 24 * 3600.0
#: Job ids per lookup when the scavenger ties files to attempts.
SCAVENGE_LOOKUP_BATCH = 500
#: Longest evidence summary recorded in an event's detail, in characters.
MAX_SUMMARY_CHARS = 300

# Compiles the read models' queries; they run on the service's own pooled connection, under its role.
_DIALECT = peewee.PostgresqlDatabase(None)


def _select(conn: psycopg.Connection, query: peewee.Query) -> list[dict[str, Any]]:
    text, params = query.bind(_DIALECT).sql()
    return conn.execute(text, params).fetchall()


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, not {value!r}")


# =============================================================================================
# Evidence: what proves that an attempt delivered its expected file
# =============================================================================================


@dataclass(frozen=True)
class AttemptEvidence:
    """The DeliveryEvidence an attempt appended (or recovery appended for it), parsed."""

    #: The listing taken before the upload, if one was recorded (the first, if several).
    baseline: Listing | None
    #: Every later listing: receipts, refused renames, interruptions, inspections, outcome receipts.
    observations: tuple[tuple[str, Listing], ...]
    #: The server refused this attempt's rename: a file already held the name, which name and size
    #: alone can never tie to this attempt.
    rename_refused: bool


def _listing(payload: dict[str, Any]) -> Listing | None:
    try:
        sha = payload.get("sha256")
        return Listing(
            final_name=str(payload["final_name"]),
            present=bool(payload["present"]),
            size=payload.get("size"),
            mtime=payload.get("mtime"),
            sha256=bytes.fromhex(sha) if sha else None,
            hash_source=payload.get("hash_source"),
            ack=payload.get("ack"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def parse_evidence(details: Iterable[str | None]) -> AttemptEvidence:
    """Parses evidence details in the order they were appended. A detail that is not one of the
    destination's evidence records is not evidence of anything, and is skipped."""
    baseline: Listing | None = None
    observations: list[tuple[str, Listing]] = []
    rename_refused = False
    for detail in details:
        try:
            payload = json.loads(detail or "")
        except ValueError:
            continue
        if not isinstance(payload, dict):
            continue
        stage = payload.get("stage")
        if stage == "outcome":
            receipt = payload.get("receipt")
            listing = _listing(receipt) if isinstance(receipt, dict) else None
            if listing is not None:
                observations.append((EvidenceStage.RECEIPT.value, listing))
            continue
        listing = _listing(payload)
        if listing is None:
            continue
        if stage == EvidenceStage.BASELINE.value:
            baseline = baseline or listing
        else:
            rename_refused = rename_refused or stage == EvidenceStage.RENAME_REFUSED.value
            observations.append((str(stage), listing))
    return AttemptEvidence(baseline, tuple(observations), rename_refused)


class Resolution(enum.Enum):
    """How recovery resolves an expired Delivering attempt, or reconciliation an OutcomeUnknown."""

    COMPLETED = Status.COMPLETED
    OUTCOME_UNKNOWN = Status.OUTCOME_UNKNOWN


@dataclass(frozen=True)
class DeliveryVerdict:
    resolution: Resolution
    summary: str


def proves_delivery(listing: Listing, expected: ExpectedFile, baseline: Listing, *, weak_allowed: bool) -> Proof:
    """The proof a listing gives that the expected file was published by this attempt, or NONE.

    It must show the expected name, have changed from the baseline, and match the expected file with
    nothing contradicting it (size, and hash where the partner exposes one). A checksum, or an
    acknowledgment newer than the baseline's, is enough; name and size alone only when the baseline
    was absent and no refused rename showed the name occupied (then a file there is this delivery,
    published by atomic rename, and no other).
    """
    if listing.final_name != expected.name or listing.same_as(baseline):
        return Proof.NONE
    proof = listing.proof_for(expected)
    if proof is Proof.ACKNOWLEDGMENT and listing.ack == baseline.ack:
        return Proof.NONE
    if proof is Proof.NAME_AND_SIZE and not (weak_allowed and not baseline.occupied):
        return Proof.NONE
    return proof


def decide_delivery(expected: ExpectedFile | None, *, replacement: bool, evidence: AttemptEvidence,
                    listing: Listing | None, inspect_error: str | None) -> DeliveryVerdict:
    """Completed only on evidence that matches the expected file; OutcomeUnknown otherwise, never
    Failed. An original's name is unique to its delivery key, so without a recorded baseline it was
    absent. A replacement shares its original's name: without its own baseline, a file there may be
    the original's, so nothing can prove this attempt delivered."""
    if expected is None:
        return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN, "no expected file recorded at cutoff 2")
    if replacement and evidence.baseline is None:
        return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN,
                               "replacement without a recorded baseline: a file under its name may be the original's")
    baseline = evidence.baseline or Listing(final_name=expected.name, present=False)
    candidates = list(evidence.observations)
    if listing is not None:
        candidates.append(("destination", listing))
    for source, observed in candidates:
        proof = proves_delivery(observed, expected, baseline, weak_allowed=not evidence.rename_refused)
        if proof is not Proof.NONE:
            return DeliveryVerdict(Resolution.COMPLETED, f"{source} shows the expected file ({proof.value})")
    if inspect_error is not None:
        seen = "destination inspection failed: " + inspect_error
    elif listing is None:
        seen = "destination not inspected"
    elif listing.present:
        seen = f"destination shows {expected.name} with size {listing.size}, not proven this attempt's"
    else:
        seen = f"destination shows no {expected.name}"
    return DeliveryVerdict(Resolution.OUTCOME_UNKNOWN, f"no evidence matches the expected file; {seen}")


def _expected(name: str | None, size: int | None, sha256: bytes | None) -> ExpectedFile | None:
    if name is None or size is None or sha256 is None or len(sha256) != 32:
        return None
    return ExpectedFile(name=name, size=size, sha256=bytes(sha256))


def read_evidence(conn: psycopg.Connection, job_id: UUID, attempt_id: UUID) -> AttemptEvidence:
    event = models.AttemptEvent
    rows = _select(conn, event.select(event.detail)
                   .where((event.job_id == job_id) & (event.attempt_id == attempt_id)
                          & (event.kind == EventKind.DELIVERY_EVIDENCE.value))
                   .order_by(event.id))
    return parse_evidence(r["detail"] for r in rows)


# =============================================================================================
# Recovery
# =============================================================================================


InspectDestination = Callable[[ExpiredAttempt], "Listing | None"]


class DestinationInspector:
    """The default ``inspect_destination``: lists the expected final name on the job's destination,
    built from its row. None when there is nothing to look at."""

    def __init__(self, db: Database):
        self.db = db

    def __call__(self, job: ExpiredAttempt) -> Listing | None:
        if job.expected_file_name is None:
            return None
        destination = models.Destination
        with self.db.connection() as conn:
            rows = _select(conn, destination.select().where(
                (destination.tenant_id == job.tenant_id) & (destination.id == job.destination_id)))
        if not rows:
            return None
        row = rows[0]
        config = DestinationConfig(
            host=row["host"], port=row["port"], username=row["username"], remote_dir=row["remote_dir"],
            host_key=row["host_key"], credential_ref=row["credential_ref"], remote_hash=row["remote_hash"],
            acknowledgments=row["acknowledgments"], name_and_size_identify=row["name_and_size_identify"],
            read_back=row["read_back"])
        return Destination(config).inspect(job.expected_file_name)


@dataclass(frozen=True)
class RecoveryConfig:
    max_attempts: int
    batch_size: int = DEFAULT_RECOVERY_BATCH
    reconcile_batch_size: int = DEFAULT_RECONCILE_BATCH

    def __post_init__(self) -> None:
        for name in ("max_attempts", "batch_size", "reconcile_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> RecoveryConfig:
        return cls(max_attempts=settings.max_attempts)


class Takeover(enum.Enum):
    """What recovery decided for one expired attempt; each has its own conditional statement."""

    STOP = "stop"                    # Running with a stop request -> Stopped
    REQUEUE = "requeue"              # Running, no stop, under the cap -> Queued with a new wake-up
    EXHAUST = "exhaust"              # Running at the cap -> Failed, AttemptsExhausted
    COMPLETE = "complete"            # Delivering, evidence matches -> Completed
    OUTCOME_UNKNOWN = "unknown"      # Delivering, no matching evidence -> OutcomeUnknown


@dataclass(frozen=True)
class RecoveryCounts:
    scanned: int = 0
    stopped: int = 0
    requeued: int = 0
    exhausted: int = 0
    completed: int = 0
    outcome_unknown: int = 0
    #: Takeovers that matched nothing: a renewal, another scheduler or the worker got there first.
    not_matched: int = 0
    #: OutcomeUnknown jobs reconciled to Completed from appended evidence.
    reconciled: int = 0
    errors: int = 0

    def as_fields(self) -> dict[str, int]:
        return dataclasses.asdict(self)


_COUNT_FIELD = {Takeover.STOP: "stopped", Takeover.REQUEUE: "requeued", Takeover.EXHAUST: "exhausted",
                Takeover.COMPLETE: "completed", Takeover.OUTCOME_UNKNOWN: "outcome_unknown"}


def decide_running(job: ExpiredAttempt, max_attempts: int) -> Takeover:
    if job.stop_requested:
        return Takeover.STOP
    if job.attempt_count < max_attempts:
        return Takeover.REQUEUE
    return Takeover.EXHAUST


class Recovery:
    """Takes over expired attempts, then reconciles OutcomeUnknown jobs whose evidence now proves a
    completed delivery. ``db`` runs as exports_app."""

    def __init__(self, db: Database, settings: Settings, inspect_destination: InspectDestination | None = None,
                 *, config: RecoveryConfig | None = None):
        self.db = db
        self.config = config or RecoveryConfig.from_settings(settings)
        self.inspect_destination = inspect_destination or DestinationInspector(db)

    def run_once(self) -> RecoveryCounts:
        run_id = str(uuid.uuid4())
        counts: dict[str, int] = dict(RecoveryCounts().as_fields())
        while True:
            with self.db.connection() as conn:
                candidates = recovery.scan_expired(conn, batch_size=self.config.batch_size)
            counts["scanned"] += len(candidates)
            progressed = False
            for job in candidates:
                progressed |= self._take_over_logged(job, run_id, counts)
            # A full batch may hide more expired attempts; rescan while this batch moved some
            # (a row whose takeover failed would otherwise be nominated again for ever).
            if len(candidates) < self.config.batch_size or not progressed:
                break
        counts["reconciled"], reconcile_errors = self._reconcile(run_id)
        counts["errors"] += reconcile_errors
        result = RecoveryCounts(**counts)
        if any(result.as_fields().values()):
            log.info("recovery.run run_id=%s %s", run_id, " ".join(f"{k}={v}" for k, v in counts.items() if v),
                     extra={"run_id": run_id, **counts})
        return result

    def _take_over_logged(self, job: ExpiredAttempt, run_id: str, counts: dict[str, int]) -> bool:
        """Counts and logs one takeover; True when it left the expired set (written or not matched)."""
        fields = {"job_id": str(job.job_id), "attempt_id": str(job.attempt_id), "tenant_id": str(job.tenant_id),
                  "run_id": run_id}
        try:
            takeover, written = self._take_over(job, run_id)
        except Exception as exc:
            # The write may have committed without an answer; the next run's scan tells.
            counts["errors"] += 1
            log.warning("recovery.takeover_failed job_id=%s attempt_id=%s run_id=%s error=%s",
                        job.job_id, job.attempt_id, run_id, type(exc).__name__,
                        extra={**fields, "error": type(exc).__name__})
            return False
        counts[_COUNT_FIELD[takeover] if written else "not_matched"] += 1
        event = takeover.value if written else "not_matched"
        log.info("recovery.%s job_id=%s attempt_id=%s run_id=%s", event, job.job_id, job.attempt_id, run_id,
                 extra={**fields, "takeover": takeover.value, "written": written})
        return True

    def _take_over(self, job: ExpiredAttempt, run_id: str) -> tuple[Takeover, bool]:
        common = dict(job_id=job.job_id, expired_attempt_id=job.attempt_id, recovery_run_id=run_id)
        if job.status is Status.RUNNING:
            takeover = decide_running(job, self.config.max_attempts)
            with self.db.connection() as conn:
                match takeover:
                    case Takeover.STOP:
                        return takeover, recovery.stop_expired(conn, **common)
                    case Takeover.REQUEUE:
                        return takeover, recovery.requeue_expired(conn, max_attempts=self.config.max_attempts,
                                                                  **common)
                    case Takeover.EXHAUST:
                        return takeover, recovery.exhaust_expired(conn, max_attempts=self.config.max_attempts,
                                                                  **common)
                    case Takeover.COMPLETE | Takeover.OUTCOME_UNKNOWN:
                        raise AssertionError(f"a Running attempt cannot be resolved as {takeover!r}")
                    case _ as unreachable:
                        assert_never(unreachable)
        if job.status is Status.DELIVERING:
            verdict = self._weigh_delivery(job, run_id)
            takeover = Takeover.COMPLETE if verdict.resolution is Resolution.COMPLETED else Takeover.OUTCOME_UNKNOWN
            with self.db.connection() as conn:
                return takeover, recovery.resolve_delivering(
                    conn, resolution=verdict.resolution.value, evidence_summary=verdict.summary[:MAX_SUMMARY_CHARS],
                    **common)
        raise AssertionError(f"the scan nominated a {job.status.value} job")

    def _weigh_delivery(self, job: ExpiredAttempt, run_id: str) -> DeliveryVerdict:
        # Outside any transaction: a slow destination holds no lock, and a renewal that commits
        # meanwhile makes the resolving write match nothing.
        listing, inspect_error = None, None
        try:
            listing = self.inspect_destination(job)
        except Exception as exc:
            # The class only: a destination error can name hosts or paths, never the summary's business.
            inspect_error = type(exc).__name__
            log.warning("recovery.inspect_failed job_id=%s attempt_id=%s run_id=%s error=%s",
                        job.job_id, job.attempt_id, run_id, inspect_error,
                        extra={"job_id": str(job.job_id), "attempt_id": str(job.attempt_id)})
        expected = _expected(job.expected_file_name, job.expected_file_bytes, job.expected_file_sha256)
        with self.db.connection() as conn:
            evidence = read_evidence(conn, job.job_id, job.attempt_id)
            verdict = decide_delivery(expected, replacement=job.replaces_job_id is not None, evidence=evidence,
                                      listing=listing, inspect_error=inspect_error)
            if listing is not None:
                # What recovery saw is evidence too, kept with its provenance before the resolution
                # is written; appending never changes the status.
                job_store.append_evidence(conn, job_id=job.job_id, attempt_id=job.attempt_id, observed_by=run_id,
                                          detail=Evidence(EvidenceStage.INSPECTED, listing,
                                                          str(job.attempt_id)).to_detail())
        return verdict

    def _reconcile(self, run_id: str) -> tuple[int, int]:
        """One-shot per attempt (the unique index allows one Reconciled event): OutcomeUnknown ->
        Completed when the attempt's appended evidence proves the delivery. Never to Failed: that
        needs the partner's affirmative word, which is an operator's reconciliation."""
        job_model = models.ExportJob
        reconciled = errors = 0
        after: UUID | None = None
        while True:
            query = (job_model.select(job_model.id, job_model.tenant_id, job_model.attempt_id,
                                      job_model.replaces_job_id, job_model.expected_file_name,
                                      job_model.expected_file_bytes, job_model.expected_file_sha256)
                     .where(job_model.status == Status.OUTCOME_UNKNOWN.value)
                     .order_by(job_model.id).limit(self.config.reconcile_batch_size))
            if after is not None:
                query = query.where(job_model.id > after)
            with self.db.connection() as conn:
                rows = _select(conn, query)
            for row in rows:
                try:
                    reconciled += self._reconcile_one(row, run_id)
                except Exception as exc:
                    errors += 1
                    log.warning("recovery.reconcile_failed job_id=%s attempt_id=%s run_id=%s error=%s",
                                row["id"], row["attempt_id"], run_id, type(exc).__name__,
                                extra={"job_id": str(row["id"]), "attempt_id": str(row["attempt_id"])})
            if len(rows) < self.config.reconcile_batch_size:
                return reconciled, errors
            after = rows[-1]["id"]

    def _reconcile_one(self, row: dict[str, Any], run_id: str) -> int:
        if row["attempt_id"] is None:
            return 0
        with self.db.connection() as conn:
            evidence = read_evidence(conn, row["id"], row["attempt_id"])
            if not evidence.observations:
                return 0
            expected = _expected(row["expected_file_name"], row["expected_file_bytes"],
                                 row["expected_file_sha256"])
            verdict = decide_delivery(expected, replacement=row["replaces_job_id"] is not None, evidence=evidence,
                                      listing=None, inspect_error=None)
            if verdict.resolution is not Resolution.COMPLETED:
                return 0
            written = recovery.reconcile(conn, tenant_id=row["tenant_id"], job_id=row["id"],
                                         attempt_id=row["attempt_id"], resolution=Status.COMPLETED,
                                         evidence=verdict.summary[:MAX_SUMMARY_CHARS], reconciled_by=run_id)
        log.info("recovery.reconciled job_id=%s attempt_id=%s run_id=%s written=%s", row["id"], row["attempt_id"],
                 run_id, written, extra={"job_id": str(row["id"]), "attempt_id": str(row["attempt_id"])})
        return int(written)


# =============================================================================================
# The sweeper
# =============================================================================================


@dataclass(frozen=True)
class SweeperConfig:
    sweep_after_seconds: float
    batch_size: int

    def __post_init__(self) -> None:
        _positive("sweep_after_seconds", self.sweep_after_seconds)
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a whole number of at least 1, not {self.batch_size!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> SweeperConfig:
        return cls(sweep_after_seconds=settings.sweep_after_seconds, batch_size=settings.sweep_batch_size)


@dataclass(frozen=True)
class SweepCounts:
    republished: int = 0
    batches: int = 0


class Sweeper:
    """Republishes Queued jobs whose last wake-up is older than the threshold, batch by batch until
    a batch comes back short; each batch is its own short statement."""

    def __init__(self, db: Database, settings: Settings, *, config: SweeperConfig | None = None):
        self.db = db
        self.config = config or SweeperConfig.from_settings(settings)

    def run_once(self) -> SweepCounts:
        republished = batches = 0
        while True:
            with self.db.connection() as conn:
                jobs = recovery.republish_due(conn, sweep_after_seconds=self.config.sweep_after_seconds,
                                              batch_size=self.config.batch_size)
            batches += 1
            republished += len(jobs)
            for job_id in jobs:
                log.info("sweeper.republished job_id=%s", job_id, extra={"job_id": str(job_id)})
            if len(jobs) < self.config.batch_size:
                break
        counts = SweepCounts(republished=republished, batches=batches)
        if republished:
            log.info("sweeper.run republished=%d batches=%d", republished, batches,
                     extra={"republished": republished, "batches": batches})
        return counts


# =============================================================================================
# The scavenger
# =============================================================================================

#: The builder's names: ``{job_id}.{attempt_id}.csv``, and ``.csv.part`` while it writes.
EXPORT_FILE = re.compile(
    r"^(?P<job>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\."
    r"(?P<attempt>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.csv(?:\.part)?$")


@dataclass(frozen=True)
class ScavengerConfig:
    work_dir: Path
    orphan_grace_seconds: float = DEFAULT_ORPHAN_GRACE_SECONDS

    def __post_init__(self) -> None:
        _positive("orphan_grace_seconds", self.orphan_grace_seconds)

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


def decide_file(file: _ExportFile, job: dict[str, Any] | None, *, now: float, grace_seconds: float) -> FileFate:
    if job is None:
        return FileFate.ORPHAN if now - file.mtime > grace_seconds else FileFate.YOUNG_ORPHAN
    current = job["attempt_id"] == file.attempt_id and job["status"] in (Status.RUNNING.value,
                                                                          Status.DELIVERING.value)
    return FileFate.KEEP if current else FileFate.ATTEMPT_ENDED


class Scavenger:
    """Deletes local export files whose attempt has ended (the worker's own removal failed or never
    ran), and files that match no job once they are older than a grace period. Touches nothing that
    is not a regular file named like the builder's."""

    def __init__(self, db: Database, settings: Settings, *, config: ScavengerConfig | None = None):
        self.db = db
        self.config = config or ScavengerConfig.from_settings(settings)

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
            fields = {"job_id": str(file.job_id), "attempt_id": str(file.attempt_id), "file": file.path.name,
                      "reason": fate.value}
            try:
                file.path.unlink()
            except FileNotFoundError:
                continue   # the worker removed it meanwhile: nothing left to do
            except OSError as exc:
                failed += 1
                log.warning("scavenger.delete_failed job_id=%s attempt_id=%s file=%s reason=%s error=%s",
                            file.job_id, file.attempt_id, file.path.name, fate.value, type(exc).__name__,
                            extra={**fields, "error": type(exc).__name__})
                continue
            deleted += 1
            log.info("scavenger.deleted job_id=%s attempt_id=%s file=%s reason=%s",
                     file.job_id, file.attempt_id, file.path.name, fate.value, extra=fields)
        counts = ScavengeCounts(examined=len(files), deleted=deleted, kept=kept, failed=failed)
        if deleted or failed:
            log.info("scavenger.run examined=%d deleted=%d kept=%d failed=%d", counts.examined, deleted, kept,
                     failed, extra=dataclasses.asdict(counts))
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

    def _jobs(self, job_ids: set[UUID]) -> dict[UUID, dict[str, Any]]:
        job_model = models.ExportJob
        found: dict[UUID, dict[str, Any]] = {}
        ids = sorted(job_ids)
        with self.db.connection() as conn:
            for start in range(0, len(ids), SCAVENGE_LOOKUP_BATCH):
                chunk = ids[start:start + SCAVENGE_LOOKUP_BATCH]
                for row in _select(conn, job_model.select(job_model.id, job_model.status, job_model.attempt_id)
                                   .where(job_model.id.in_(chunk))):
                    found[row["id"]] = row
        return found


# =============================================================================================
# The process
# =============================================================================================


def _run_logged(name: str, service_run: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            service_run()
        except Exception as exc:
            # The next interval tries again; one failed run (database unreachable) stops nothing.
            log.warning("scheduler.run_failed service=%s error=%s", name, type(exc).__name__,
                        extra={"service": name, "error": type(exc).__name__})

    return run


def build_scheduler(settings: Settings, db: Database, *, inspect_destination: InspectDestination | None = None,
                    blocking: bool = False) -> BaseScheduler:
    """The three services at their intervals, each at most one run at a time (``max_instances=1``)
    with missed runs folded into one (``coalesce``). Not started."""
    if db.role is not Role.APP:
        raise ValueError(f"the scheduler runs as {Role.APP.value}, not {db.role.value}")
    scheduler: BaseScheduler = (BlockingScheduler if blocking else BackgroundScheduler)(timezone="UTC")
    services = (
        ("recovery", Recovery(db, settings, inspect_destination).run_once, settings.recovery_interval_seconds),
        ("sweeper", Sweeper(db, settings).run_once, settings.sweep_interval_seconds),
        ("scavenger", Scavenger(db, settings).run_once, settings.scavenge_interval_seconds),
    )
    for name, run, interval in services:
        scheduler.add_job(_run_logged(name, run), "interval", seconds=interval, id=name, name=name,
                          max_instances=1, coalesce=True, misfire_grace_time=None,
                          next_run_time=_now_utc())
    return scheduler


def _now_utc():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def run_forever(settings: Settings, stop_event: threading.Event) -> None:
    """The ``exports scheduler`` process: runs the services until ``stop_event`` is set, then waits
    for the runs in progress."""
    url = settings.database_url
    if url is None:
        from app import embedded

        url = embedded.database_url(settings)
    with Database(url, Role.APP, min_size=1, max_size=4, name="exports-scheduler") as db:
        scheduler = build_scheduler(settings, db)
        scheduler.start()
        log.info("scheduler.started recovery_every=%gs sweep_every=%gs scavenge_every=%gs",
                 settings.recovery_interval_seconds, settings.sweep_interval_seconds,
                 settings.scavenge_interval_seconds)
        try:
            stop_event.wait()
        finally:
            scheduler.shutdown(wait=True)
            log.info("scheduler.stopped")
