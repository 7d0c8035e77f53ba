"""The soak's users: exports created continuously, and operators who cancel (double clicks included),
edit, replace and reconcile at random moments, each through the same store calls the ``exports``
commands make, on connections of their own straight to the database (not through the proxy: the
faults are the system's, not the operators').

Everything the operators were answered goes into the ``Ledger`` the checker reads. An operator call
that failed because the database was away (a restart) was answered nothing and promised nothing: it
is counted as unanswered and left out of the ledger, as an operator would retry it.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from app.delivery import naming
from app.store import cancellation, export, views
from app.store.database import connect
from app.store.types import CancellationReply, EditResult, ReplacementResult, Role, Status
from app.store.views import Views
from exports_devtools.chaos.record import CancelAnswer, Ledger, Reconciliation

#: What one created export may draw, each with its probability.
CANCEL_SHARE = 0.15
#: Of the cancels, the share clicked twice with the same request id.
DOUBLE_CLICK_SHARE = 0.35
EDIT_SHARE = 0.05
#: A cancel or edit comes this many seconds after the creation, at most (uniform): before the claim,
#: while building, around cutoff 2 or after the end.
FOLLOW_UP_WITHIN = 4.0
#: Seconds between two rounds of the operator who looks at OutcomeUnknown and Failed exports.
OPERATOR_ROUND_SECONDS = 5.0
#: Exports one operator round looks at, per status.
OPERATOR_ROUND_LIMIT = 20
#: Share of the failed-not-delivered exports the operator replaces.
REPLACE_SHARE = 0.5
OPERATOR = "chaos-operator"
LOCK_TIMEOUT = "2s"
#: What an operator's call raises when the database went away under it (restarted, or its session
#: terminated): psycopg's, and peewee's wrapping of it for the views.
DATABASE_AWAY: tuple[type[Exception], ...] = (psycopg.OperationalError, *views.UNAVAILABLE)


@dataclass(frozen=True)
class Target:
    """Where the workload sends exports: the tenant, its destinations (the first is the usual one, the
    second is where an edit moves an export), and the partner's directory of each destination as an
    operator sees it."""

    app_url: str
    tenant_id: UUID
    destination_ids: tuple[UUID, ...]
    partner_dirs: Mapping[UUID, Path]
    operator: str = OPERATOR


@dataclass
class Workload:
    target: Target
    rate: float
    rng: random.Random
    ledger: Ledger
    stop: threading.Event
    unanswered: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    #: Originals this operator replaced (or found replaced): not replaced again. Reconciling one from a
    #: listing is still tried: the database refuses it once the replacement has passed cutoff 2.
    replaced: set[UUID] = field(default_factory=set)
    _local: threading.local = field(default_factory=threading.local)
    _pending: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _pending_lock: threading.Lock = field(default_factory=threading.Lock)
    _sequence: itertools.count = field(default_factory=itertools.count)
    _rng_lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    _pool: ThreadPoolExecutor | None = None

    # -- running ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="chaos-operator")
        for name, loop in (("create", self._create_loop), ("follow-ups", self._follow_up_loop),
                           ("operator", self._operator_loop)):
            thread = threading.Thread(target=loop, name=f"chaos-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop_creating(self) -> None:
        """Stops new exports and the follow-ups; the operator loop stops with ``stop`` as well."""
        self.stop.set()
        for thread in self._threads:
            thread.join(30)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _draw(self, draw: Callable[[random.Random], Any]) -> Any:
        with self._rng_lock:
            return draw(self.rng)

    def _create_loop(self) -> None:
        while not self.stop.wait(self._draw(lambda r: r.expovariate(self.rate))):
            job_id = self._created()
            if job_id is None:
                continue
            roll = self._draw(lambda r: r.random())
            delay = self._draw(lambda r: r.uniform(0, FOLLOW_UP_WITHIN))
            if roll < CANCEL_SHARE:
                double = self._draw(lambda r: r.random()) < DOUBLE_CLICK_SHARE
                self._later(delay, functools.partial(self.cancel, job_id, double=double))
            elif roll < CANCEL_SHARE + EDIT_SHARE:
                self._later(delay, functools.partial(self.edit, job_id))

    def _created(self) -> UUID | None:
        created: list[UUID | None] = [None]

        def create() -> None:
            created[0] = self.create()

        self._guarded(create)
        return created[0]

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        with self._pending_lock:
            heapq.heappush(self._pending, (time.monotonic() + delay, next(self._sequence), action))

    def _follow_up_loop(self) -> None:
        assert self._pool is not None
        while not self.stop.wait(0.05):
            now = time.monotonic()
            with self._pending_lock:
                due = []
                while self._pending and self._pending[0][0] <= now:
                    due.append(heapq.heappop(self._pending)[2])
            for action in due:
                self._pool.submit(self._guarded, action)

    def _operator_loop(self) -> None:
        while not self.stop.wait(OPERATOR_ROUND_SECONDS):
            self._guarded(self.operator_round)

    def _guarded(self, action: Callable[[], None]) -> None:
        """Runs one operator action; a database that is away answers nothing (counted), anything
        else is a bug of the soak, counted in ``errors``."""
        name = getattr(getattr(action, "func", action), "__name__", "action")
        try:
            action()
        except DATABASE_AWAY:
            self.unanswered[name] += 1
            self._drop_connection()
        except Exception as exc:   # the soak's own bug: kept for the report, which then fails the run
            self.errors[f"{name}: {type(exc).__name__}: {exc}"[:300]] += 1
            self._drop_connection()

    # -- connections --------------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = connect(self.target.app_url, Role.APP, application_name="exports-chaos")
        return conn

    def _views(self) -> Views:
        held = getattr(self._local, "views", None)
        if held is None:
            held = self._local.views = Views(self.target.app_url)
        return held

    def _drop_connection(self) -> None:
        for name in ("conn", "views"):
            held = getattr(self._local, name, None)
            if held is not None:
                try:
                    held.close()
                except Exception:   # it is broken already; we only want it gone
                    pass
                setattr(self._local, name, None)

    # -- the operators' actions ---------------------------------------------------------------------

    def create(self) -> UUID | None:
        job_id = uuid.uuid4()
        try:
            result, _name = naming.create_export(self._conn(), job_id=job_id, tenant_id=self.target.tenant_id,
                                                 destination_id=self.target.destination_ids[0],
                                                 delivery_key=uuid.uuid4().hex, created_by=self.target.operator)
        except DATABASE_AWAY:
            # The creation may have committed without its answer: the checker sees such a job like any
            # other, so it still counts; we just cannot follow it up.
            self.unanswered["create"] += 1
            self._drop_connection()
            return None
        if result is not export.CreateResult.CREATED:
            raise AssertionError(f"creating an export answered {result}")
        self.ledger.add("created", job_id)
        return job_id

    def cancel(self, job_id: UUID, *, double: bool) -> None:
        request_id = uuid.uuid4()
        first = self._cancel_once(job_id, request_id)
        if first is None or not double:
            return
        second = self._cancel_once(job_id, request_id)
        if second is not None:
            self.ledger.add("double_clicks", (first, second))

    def _cancel_once(self, job_id: UUID, request_id: UUID) -> CancelAnswer | None:
        result = cancellation.request_cancellation(
            self._conn(), tenant_id=self.target.tenant_id, job_id=job_id, request_id=request_id,
            requested_by=self.target.operator, reason="chaos: changed my mind", lock_timeout=LOCK_TIMEOUT)
        if result.reply is not CancellationReply.RECORDED:
            self.unanswered[f"cancel-{result.reply.value}"] += 1
            return None
        assert result.outcome is not None
        answer = CancelAnswer(job_id, request_id, result.outcome.value, time.time(),
                              result.found_status.value if result.found_status else None)
        self.ledger.add("cancels", answer)
        return answer

    def edit(self, job_id: UUID) -> None:
        if len(self.target.destination_ids) < 2:
            return
        outcome = export.edit_terms(self._conn(), tenant_id=self.target.tenant_id, job_id=job_id,
                                    expected_version=1, destination_id=self.target.destination_ids[1])
        if outcome.result is EditResult.CHANGED:
            self.ledger.count("edits")

    def operator_round(self) -> None:
        """What an operator does with the exports that wait for one: an OutcomeUnknown export whose
        file the partner shows whole is reconciled Completed, citing the listing; one whose file is not
        there is replaced; some exports that failed without delivering are replaced."""
        views = self._views()
        for summary in views.jobs(tenant_id=self.target.tenant_id, status=Status.OUTCOME_UNKNOWN,
                                  limit=OPERATOR_ROUND_LIMIT):
            job = views.job(self.target.tenant_id, summary.id)
            if job is None or job.status != Status.OUTCOME_UNKNOWN.value or job.attempt_id is None:
                continue
            evidence = self._partner_shows(self.target.partner_dirs.get(job.destination_id), job.expected_file_name,
                                           job.expected_file_bytes, job.expected_file_sha256,
                                           job.expected_marker_name, job.expected_marker)
            if evidence is not None:
                if export.reconcile(self._conn(), tenant_id=self.target.tenant_id, job_id=job.id,
                                    attempt_id=job.attempt_id, resolution=Status.COMPLETED, evidence=evidence,
                                    reconciled_by=self.target.operator):
                    self.ledger.add("reconciliations",
                                    Reconciliation(job.id, job.attempt_id, Status.COMPLETED.value, evidence))
            elif job.replaces_job_id is None and job.id not in self.replaced:
                self._replace(job.id, "chaos: the partner shows no file")
        for summary in views.jobs(tenant_id=self.target.tenant_id, status=Status.FAILED, limit=OPERATOR_ROUND_LIMIT):
            if summary.failure_reason == "NotDelivered" and self._draw(lambda r: r.random()) < REPLACE_SHARE:
                self._replace(summary.id, "chaos: not delivered, send it again")

    def _partner_shows(self, directory: Path | None, name: str | None, size: int | None, sha256: bytes | None,
                       marker_name: str | None = None, marker: bytes | None = None) -> str | None:
        """The evidence an operator would cite: the partner's file under the expected name with the
        expected size and hash, and its completion marker as recorded where there is one; or None."""
        if directory is None or not name or size is None or sha256 is None:
            return None
        try:
            data = (directory / name).read_bytes()
            marked = marker_name is None or (directory / marker_name).read_bytes() == bytes(marker or b"")
        except OSError:
            return None
        if len(data) != size or hashlib.sha256(data).digest() != sha256 or not marked:
            return None
        with_marker = f" and its marker {marker_name}" if marker_name else ""
        return f"operator listing of the partner: {name} {size} bytes sha256 {sha256.hex()}{with_marker}"

    def _replace(self, job_id: UUID, reason: str) -> None:
        result = export.create_replacement(self._conn(), job_id=uuid.uuid4(), tenant_id=self.target.tenant_id,
                                           original_job_id=job_id, created_by=self.target.operator,
                                           replacement_reason=reason, overwrite_agreement_ref=None)
        if result is ReplacementResult.CREATED:
            self.ledger.count("replacements")
        if result in (ReplacementResult.CREATED, ReplacementResult.SLOT_TAKEN):
            self.replaced.add(job_id)
