"""The builder: streams a tenant's consenting contacts from PostgreSQL into the local file the partner
will receive, shaped by the destination's delivery profile (``app.actors.partner_file``).

PostgreSQL writes the rows itself (``COPY ... TO STDOUT``) and the builder streams them block by block
to disk, compressing, sizing and hashing as it writes, so memory stays flat in the number of contacts.

Stopping: the stop signal is checked between blocks, and setting it also cancels the running
statement, so a stop is not held up by a slow query. A stop raises ``BuildStopped``, unwrapped, after
removing the partial file. A transient database error (the connection lost or terminated, the server
restarting, a statement timeout: ``app.store.errors.transient``) is not a failure of the build: it is
tried again from the start on a fresh connection, a few times, and if it keeps failing the build
raises ``BuildInterrupted``, after which the attempt writes nothing and recovery requeues it. Every
other failure (an error in the data or the query, the local disk) is wrapped in ``BuildFailed``. Nothing
here ever leaves the process: a failed or stopped build is always reversible.

Files are named ``{job_id}.{attempt_id}.csv`` whatever their format (``.part`` while written) under the
work directory, so the scavenger can tie any file it finds to an attempt.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never
from uuid import UUID

import psycopg

from app import logs, metrics
from app.actors import partner_file
from app.actors.policy import Scope
from app.actors.stop import StopReason, StopSignal
from app.delivery.openpgp import KeyExpired, KeyRefused
from app.delivery.profile import DEFAULT_PROFILE, Profile
from app.errors import ExportsError
from app.store import errors
from app.store import worker as worker_reads
from app.store.database import Database
from app.store.types import FailureCause, Role

log = logs.get(__name__)

APPLICATION_NAME = "exports-builder"
#: Connections a worker process's builds share: one per build in progress, at most.
POOL_SIZE = 8

class BuildError(ExportsError):
    """Raised when a build did not produce its file, through one of the three subclasses below; nothing
    left the process."""


class BuildStopped(BuildError):
    """Raised when the attempt's stop signal ended the build; the partial file is already removed."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(f"build stopped: {reason.value}")
        self.reason = reason


class BuildFailed(BuildError):
    """Raised when the data, the query, the local disk or the profile's OpenPGP keys failed the build (the
    cause is chained). ``cause`` is CONFIGURATION when an operator must act first (a partner key expired
    since it was set, our signing key gone): the retry policy never retries that."""

    def __init__(self, message: str, cause: FailureCause | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class BuildInterrupted(BuildError):
    """Raised when the database kept failing transiently through every try; the cause is chained. Not
    a failure of the export: the attempt writes nothing and recovery takes it over."""


@dataclass(frozen=True)
class BuiltFile:
    """A complete local export file and what cutoff 2 records about it."""

    path: Path
    size: int
    sha256: bytes = field(repr=False)
    rows: int
    #: An incremental build's snapshot (pg_snapshot's text): its rows are exactly what it could see.
    snapshot: str | None = None

    def delete(self) -> bool:
        """Best effort and idempotent, never raises; a failure is logged for the scavenger."""
        return remove_quietly(self.path)


def file_name(job_id: UUID, attempt_id: UUID) -> str:
    return f"{job_id}.{attempt_id}.csv"


def remove_quietly(path: Path) -> bool:
    try:
        path.unlink(missing_ok=True)
        return True
    except OSError as exc:
        log.error("builder.remove_failed", path=path, error=type(exc).__name__)
        return False


#: Bytes gathered from COPY before they are written, hashed and the stop is checked: memory stays
#: bounded by this, and a stop is noticed within one chunk.
CHUNK_BYTES = 256 * 1024

#: Tries of a build that a transient database error interrupts, and the seconds before the second
#: try, doubled for each later one (a stop cuts the wait short).
BUILD_TRIES = 4
BUILD_RETRY_BACKOFF_SECONDS = 0.5

#: Called after every chunk written (the last one too, so at least once per build), with the stop signal.
#: Tests use it to hold a build at a known point; production passes none.
Checkpoint = Callable[[StopSignal], None]


class ContactsBuilder:
    """Builds on connections of a small pool of its own (opening one per build cost 5-12 ms); the pool
    replaces a connection a database blip broke, and ``close()`` releases it."""

    def __init__(self, url: str, work_dir: Path, *, checkpoint: Checkpoint | None = None,
                 db: Database | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.checkpoint = checkpoint
        self._url = url
        self._db = db

    @property
    def db(self) -> Database:
        if self._db is None:   # on the first build, so a worker that never builds opens nothing
            self._db = Database(self._url, Role.APP, min_size=0, max_size=POOL_SIZE, name=APPLICATION_NAME)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def build(self, *, job_id: UUID, attempt_id: UUID, tenant_id: UUID, scope: Scope, stop: StopSignal,
              profile: Profile = DEFAULT_PROFILE, changes: partner_file.Changes | None = None) -> BuiltFile:
        """The file, from one snapshot of the contacts; with ``changes``, an incremental export's, which
        records that snapshot."""
        final = self.work_dir / file_name(job_id, attempt_id)
        partial = final.with_name(final.name + ".part")
        tries = 0
        while True:
            tries += 1
            try:
                built = self._write(partial, tenant_id, scope, stop, profile, changes)
                os.replace(partial, final)
                return BuiltFile(final, *built)
            except BuildStopped:
                remove_quietly(partial)
                raise
            except (KeyExpired, KeyRefused) as exc:
                remove_quietly(partial)
                raise BuildFailed(str(exc), FailureCause.CONFIGURATION) from exc
            except Exception as exc:
                remove_quietly(partial)
                if stop.is_set():
                    # The cancellation the stop caused surfaces as the database's error: it is a stop.
                    raise BuildStopped(stop.reason or StopReason.SHUTDOWN) from None
                if not errors.transient(exc):
                    raise BuildFailed(f"{type(exc).__name__}: {exc}") from exc
                if tries >= BUILD_TRIES:
                    raise BuildInterrupted(f"{type(exc).__name__} on each of {tries} tries") from exc
                log.warning("builder.retrying", job_id=job_id, attempt_id=attempt_id, tries=tries,
                            error=type(exc).__name__)
                metrics.worker().build_retries.inc()
                if stop.wait(BUILD_RETRY_BACKOFF_SECONDS * 2 ** (tries - 1)):
                    raise BuildStopped(stop.reason or StopReason.SHUTDOWN) from None
            except BaseException:
                remove_quietly(partial)
                remove_quietly(final)
                raise

    def _write(self, partial: Path, tenant_id: UUID, scope: Scope, stop: StopSignal, profile: Profile,
               changes: partner_file.Changes | None) -> tuple[int, bytes, int, str | None]:
        if scope is not Scope.CONSENTING_CONTACTS:
            # A scope with no query here is a bug mypy points at, not an input to refuse.
            assert_never(scope)
        self._check(stop)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        rows = 0
        snapshot = None
        with self.db.connection() as conn, (conn.transaction() if changes is not None else nullcontext()):
            unregister = stop.on_set(lambda _reason: _cancel(conn))
            try:
                if changes is not None:
                    snapshot = worker_reads.begin_snapshot(conn)
                with partner_file.output(partial, profile) as (out, encryptor):
                    if encryptor is not None:
                        # A stop must not wait for gpg to drain a full pipe.
                        unregister_gpg = stop.on_set(lambda _reason: encryptor.abort())
                    with partner_file.Sink(out, profile.compression) as sink:
                        for block, block_rows in partner_file.plaintext(conn, tenant_id, profile, CHUNK_BYTES,
                                                                        changes=changes):
                            self._flush(block, sink, stop)
                            rows += block_rows
                        sink.finish()
                    self._check(stop)
                    if encryptor is not None:
                        unregister_gpg()
                        encryptor.finish()
                    # No fsync: the file lives only as long as this attempt, which reads it back from the
                    # page cache; a crash that could lose unsynced pages ends the attempt with it, and
                    # the scavenger removes what is left. A disk barrier per export bought nothing.
            finally:
                unregister()
        if encryptor is not None:
            return (*partner_file.file_digest(partial), rows, snapshot)
        return sink.size, sink.digest.digest(), rows, snapshot

    def _flush(self, chunk: bytes | bytearray, sink: partner_file.Sink, stop: StopSignal) -> None:
        """Writes one chunk, then checks the stop (and the tests' checkpoint)."""
        self._check(stop)
        sink.write(chunk)
        if self.checkpoint is not None:
            self.checkpoint(stop)
            self._check(stop)

    @staticmethod
    def _check(stop: StopSignal) -> None:
        if stop.is_set():
            raise BuildStopped(stop.reason or StopReason.SHUTDOWN)


def _cancel(conn: psycopg.Connection) -> None:
    try:
        conn.cancel_safe(timeout=2)
    except Exception:   # the statement may have ended already; the block check catches the stop
        log.debug("builder.cancel_failed", exc_info=True)
