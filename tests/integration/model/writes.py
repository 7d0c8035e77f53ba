"""Each actor's writes, built as ops: the real call through the store, answering in the model's
words, and the same write made on a model. The state machine runs an op alone (the answers must be
equal) or two at once (the answers must be those of one serial order)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import UUID

import psycopg

from app.delivery.evidence import Evidence, EvidenceStage, Listing
from app.maintenance.recovery import Recovery, RecoveryConfig
from app.store import cancellation, export, recovery, worker
from app.store.database import Database
from app.store.types import ExpectedFile, FailureCode, Status
from tests.factories import Seeder
from tests.integration.model.reference import COMPLETED, DELIVERING, FAILED, OUTCOME_UNKNOWN, Job, Model

MAX_ATTEMPTS = 2
#: Long enough that no lease expires by itself during a run: only the owner's time travel ages one.
LEASE_SECONDS = 600.0
FILE_SIZE = 123


def marked(key: str) -> bool:
    """Half the keys' profiles write a completion marker after the file (``<file>.done``)."""
    return hashlib.sha256(key.encode()).digest()[0] % 2 == 0


def expected_file(key: str, attempt: UUID) -> ExpectedFile:
    """The file an attempt builds: a rebuild can differ, so its hash is the attempt's own; with its
    completion marker where the key's profile writes one, recorded with it at cutoff 2."""
    name = export.final_name(key)
    marker = (name + ".done", b"") if marked(key) else (None, None)
    return ExpectedFile(name, FILE_SIZE, hashlib.sha256(attempt.bytes).digest(), *marker)


def baseline(key: str, attempt: UUID) -> str:
    """The baseline an attempt lists before cutoff 2 and appends with it: the final name absent."""
    return Evidence(EvidenceStage.BASELINE, Listing(export.final_name(key), present=False), str(attempt)).to_detail()


def receipt(key: str, attempt: UUID, proves: bool) -> str:
    """A receipt the attempt appends: of its own file (name, size and checksum, and its marker where it
    has one), or one that proves nothing: for a marked key, its own file without the marker (the partner
    has not been told it is complete), else a file whose size contradicts it."""
    wanted = expected_file(key, attempt)
    if proves or wanted.marker is not None:
        listing = Listing(wanted.name, present=True, size=wanted.size, sha256=wanted.sha256,
                          hash_source="check-file-name", marker=wanted.marker_sha256_hex if proves else None)
    else:
        listing = Listing(wanted.name, present=True, size=wanted.size + 1, sha256=wanted.sha256,
                          hash_source="check-file-name")
    return Evidence(EvidenceStage.RECEIPT, listing, str(attempt)).to_detail()


@dataclass
class Worker:
    """A worker process: its pool, and what it believes about the jobs it touched."""

    name: str
    db: Database
    attempts: dict[UUID, UUID] = field(default_factory=dict)
    versions: dict[UUID, int] = field(default_factory=dict)


@dataclass
class Env:
    """The resources one test gives every example: connections under the restricted roles."""

    admin: psycopg.Connection
    seeder: Seeder
    operator: psycopg.Connection
    operator_tab: psycopg.Connection
    reconciler: psycopg.Connection
    maintenance: psycopg.Connection
    worker_dbs: dict[str, Database]
    recovery_db: Database


@dataclass
class Op:
    """One write by one actor: ``run`` makes it for real and answers in the model's words, ``predict``
    makes it on a model, ``after`` is the actor's own bookkeeping once it has the answer."""

    actor: str
    label: str
    run: Callable[[], object]
    predict: Callable[[Model], object]
    after: Callable[[object], None] = lambda answer: None
    #: For a writer in two steps another writer can come between (cutoff 2 and the re-read that
    #: explains a refusal; recovery's scan and its takeovers): makes the first step on a model and
    #: answers None when that finished the op, else the rest, which answers from a later model.
    split: Callable[[Model], Callable[[Model], object] | None] | None = None


@dataclass(frozen=True)
class Click:
    tenant: UUID
    job: UUID
    request_id: UUID
    operator: str


class Writes:
    """The writes of every actor, for the jobs of one model. ``model`` answers the current model (a
    race replaces it with the copy whose order won); ``new_id`` mints ids for jobs, attempts and clicks."""

    def __init__(self, env: Env, model: Callable[[], Model], new_id: Callable[[], UUID]):
        self.env = env
        self.model = model
        self.new_id = new_id

    def job(self, job_id: UUID) -> Job:
        return self.model().jobs[job_id]

    def attempt(self, w: Worker, job_id: UUID) -> UUID:
        """The attempt the worker holds for the job, or one that never claimed anything."""
        return w.attempts.get(job_id) or self.new_id()

    # --- the operator's writes --------------------------------------------------------------------

    def create(self, job_id: UUID, tenant: UUID, destination: UUID, key: str) -> Op:
        def run():
            return export.create(self.env.operator, job_id=job_id, tenant_id=tenant, destination_id=destination,
                                 delivery_key=key, created_by="dana").value
        return Op("operator", "create", run, lambda m: m.create(job_id, tenant, destination, key))

    def replace(self, conn: psycopg.Connection, new_id: UUID, tenant: UUID, original: UUID,
                 actor: str = "operator") -> Op:
        def run():
            return export.create_replacement(conn, job_id=new_id, tenant_id=tenant, original_job_id=original,
                                             created_by="dana", replacement_reason="the partner lost it").value
        return Op(actor, "replace", run, lambda m: m.create_replacement(new_id, tenant, original))

    def edit(self, conn: psycopg.Connection, tenant: UUID, job_id: UUID, version: int, destination: UUID,
              actor: str = "operator") -> Op:
        def run():
            return export.edit_terms(conn, tenant_id=tenant, job_id=job_id, expected_version=version,
                                     destination_id=destination).result.value
        return Op(actor, f"edit v{version}", run, lambda m: m.edit(tenant, job_id, version, destination))

    def cancel(self, conn: psycopg.Connection, click: Click, actor: str = "operator") -> Op:
        def run():
            result = cancellation.request_cancellation(conn, tenant_id=click.tenant, job_id=click.job,
                                                       request_id=click.request_id, requested_by=click.operator)
            return result.reply.value, result.outcome.value if result.outcome else None
        return Op(actor, "cancel", run,
                  lambda m: m.cancel(click.tenant, click.job, click.request_id, click.operator))

    def reconcile(self, conn: psycopg.Connection, job_id: UUID, attempt: UUID | None, resolution: str,
                   actor: str = "operator") -> Op:
        tenant = self.job(job_id).tenant

        def run():
            if attempt is None:
                return False
            return export.reconcile(conn, tenant_id=tenant, job_id=job_id, attempt_id=attempt,
                                    resolution=Status(resolution), evidence="the partner's report",
                                    reconciled_by="rita")
        return Op(actor, f"reconcile to {resolution}", run, lambda m: m.reconcile(tenant, job_id, attempt, resolution))

    def correct(self, conn: psycopg.Connection, job_id: UUID, attempt: UUID | None, recorded: str,
                 actor: str = "reconciler") -> Op:
        tenant = self.job(job_id).tenant
        corrected = FAILED if recorded == COMPLETED else COMPLETED
        code = "NotDelivered" if corrected == FAILED else None

        def run():
            if attempt is None:
                return False
            return export.correct(conn, tenant_id=tenant, job_id=job_id, attempt_id=attempt,
                                  recorded_status=Status(recorded), corrected_status=Status(corrected),
                                  failure_reason=FailureCode(code) if code else None, evidence_ref="ticket-7",
                                  why="the partner confirmed", corrected_by="rita")
        return Op(actor, f"correct {recorded} to {corrected}", run,
                  lambda m: m.correct(tenant, job_id, attempt, recorded, corrected, code))

    # --- a worker's writes ------------------------------------------------------------------------

    def read(self, w: Worker, job_id: UUID) -> int:
        with w.db.connection() as conn:
            view = worker.read_job(conn, job_id)
        job = self.job(job_id)
        assert (view.status.value, view.version) == (job.status, job.version), f"{w.name} read {view}"
        w.versions[job_id] = view.version
        return view.version

    def claim(self, w: Worker, job_id: UUID, version: int) -> Op:
        attempt = self.new_id()

        def run():
            return export.claim(w.db, job_id=job_id, checked_version=version, attempt_id=attempt, worker_id=w.name,
                                lease_seconds=LEASE_SECONDS).value

        def after(answer):
            if answer == "Claimed":
                w.attempts[job_id] = attempt
        return Op(w.name, f"claim v{version}", run, lambda m: m.claim(job_id, version, attempt), after)

    def authorize(self, w: Worker, job_id: UUID, *, with_baseline: bool = True) -> Op:
        """Cutoff 2, carrying the attempt's baseline (as the runner sends it) or nothing."""
        job, attempt = self.job(job_id), self.attempt(w, job_id)
        evidence = [baseline(job.key, attempt)] if with_baseline else []

        def run():
            return export.authorize_delivery(w.db, job_id=job_id, tenant_id=job.tenant, attempt_id=attempt,
                                             expected=expected_file(job.key, attempt),
                                             replaces_job_id=job.original, evidence=evidence,
                                             observed_by=w.name).value

        def split(m: Model):
            # Refused: the re-read that explains why may come after another writer's commit.
            before = m.jobs[job_id].status
            m.authorize(job_id, attempt, evidence=len(evidence))
            wrote = m.jobs[job_id].status != before
            return None if wrote else (lambda later: later.authorize_reread(job_id, attempt))
        return Op(w.name, "authorize" + (" with its baseline" if evidence else ""), run,
                  lambda m: m.authorize(job_id, attempt, evidence=len(evidence)), split=split)

    def renew(self, w: Worker, job_id: UUID) -> Op:
        attempt = self.attempt(w, job_id)

        def run():
            with w.db.connection() as conn:
                return export.renew_lease(conn, job_id=job_id, attempt_id=attempt, lease_seconds=LEASE_SECONDS).value
        return Op(w.name, "renew", run, lambda m: m.renew(job_id, attempt))

    def finish_stopped(self, w: Worker, job_id: UUID) -> Op:
        attempt = self.attempt(w, job_id)

        def run():
            return export.finish_stopped(w.db, job_id=job_id, attempt_id=attempt, worker_id=w.name,
                                         stop_point="WhileBuilding").value
        return Op(w.name, "finish stopped", run, lambda m: m.finish_stopped(job_id, attempt))

    def finish_failed(self, w: Worker, job_id: UUID, code: str) -> Op:
        attempt = self.attempt(w, job_id)

        def run():
            return export.finish_failed(w.db, job_id=job_id, attempt_id=attempt, worker_id=w.name,
                                        failure_reason=FailureCode(code)).value
        return Op(w.name, f"finish failed {code}", run, lambda m: m.finish_failed(job_id, attempt, code))

    def finish_delivery(self, w: Worker, job_id: UUID, outcome: str, code: str | None, *,
                        receipt_proves: bool | None = None) -> Op:
        """The terminal write, carrying a receipt (of its own file, or of another) or no evidence."""
        job, attempt = self.job(job_id), self.attempt(w, job_id)
        code = code if outcome == FAILED else None
        evidence = [] if receipt_proves is None else [receipt(job.key, attempt, receipt_proves)]

        def run():
            return export.finish_delivery(w.db, job_id=job_id, attempt_id=attempt, worker_id=w.name,
                                          outcome=Status(outcome),
                                          failure_reason=FailureCode(code) if code else None,
                                          evidence=evidence, observed_by=w.name).value
        carrying = "" if receipt_proves is None else f" with a receipt {'of its own file' if receipt_proves else ''}"
        return Op(w.name, f"finish delivery {outcome} {code or ''}{carrying}", run,
                  lambda m: m.finish_delivery(job_id, attempt, outcome, code, receipt_proves=receipt_proves))

    def evidence(self, w: Worker, job_id: UUID, proves: bool) -> Op:
        job, attempt = self.job(job_id), self.attempt(w, job_id)

        def run():
            with w.db.connection() as conn:
                return export.append_evidence(conn, job_id=job_id, attempt_id=attempt, observed_by=w.name,
                                              detail=receipt(job.key, attempt, proves))
        return Op(w.name, "append evidence", run, lambda m: m.append_evidence(job_id, attempt, proves))

    def reject(self, w: Worker, job_id: UUID, version: int) -> Op:
        def run():
            with w.db.connection() as conn:
                return export.reject(conn, job_id=job_id, checked_version=version)
        return Op(w.name, f"reject v{version}", run, lambda m: m.reject(job_id, version))

    # --- recovery's writes ------------------------------------------------------------------------

    def takeover(self, kind: str, job_id: UUID, attempt: UUID) -> Op:
        conn = self.env.maintenance
        common = dict(job_id=job_id, expired_attempt_id=attempt, recovery_run_id="model-run")
        job = self.job(job_id)
        resolution = COMPLETED if Model.proves_delivery(job, attempt) else OUTCOME_UNKNOWN
        if kind == "resolve as Failed":
            resolution = FAILED
        # The Running takeovers take a batch of nominations; the model's one takes one, and one job
        # taken over is one True.
        nominated = [(job_id, attempt)]
        runs = {
            "requeue": lambda: bool(recovery.requeue_expired(conn, nominated, max_attempts=MAX_ATTEMPTS,
                                                             recovery_run_id="model-run")),
            "stop": lambda: bool(recovery.stop_expired(conn, nominated, recovery_run_id="model-run")),
            "exhaust": lambda: bool(recovery.exhaust_expired(conn, nominated, max_attempts=MAX_ATTEMPTS,
                                                             recovery_run_id="model-run")),
            "resolve": lambda: recovery.resolve_delivering(conn, resolution=Status(resolution),
                                                           evidence_summary="model", **common),
        }
        predictions = {
            "requeue": lambda m: m.requeue_expired(job_id, attempt),
            "stop": lambda m: m.stop_expired(job_id, attempt),
            "exhaust": lambda m: m.exhaust_expired(job_id, attempt),
            "resolve": lambda m: m.resolve_delivering(job_id, attempt, resolution),
        }
        base = "resolve" if kind.startswith("resolve") else kind
        return Op("recovery", f"{kind} ({resolution})" if base == "resolve" else kind, runs[base], predictions[base])

    def decided_takeover(self, job_id: UUID) -> Op:
        """The takeover recovery's rules pick for the job's current attempt, as a scan would nominate it."""
        job = self.job(job_id)
        if job.status == DELIVERING:
            kind = "resolve"
        elif job.stop_request is not None:
            kind = "stop"
        elif job.attempt_count < MAX_ATTEMPTS:
            kind = "requeue"
        else:
            kind = "exhaust"
        return self.takeover(kind, job_id, job.attempt or self.new_id())

    def recovery_run(self) -> Op:
        """Recovery's whole run (the destination is not inspected: only appended evidence counts)."""
        def run():
            counts = Recovery(self.env.recovery_db, RecoveryConfig(max_attempts=MAX_ATTEMPTS),
                              inspect_destination=lambda job: None).run_once()
            return {name: n for name, n in counts.as_fields().items() if n and name != "scanned"}

        def split(m: Model):
            nominations = m.recovery_scan()
            return (lambda later: later.recovery_take_over(nominations)) if nominations else None
        return Op("recovery", "run recovery", run, lambda m: m.recovery_run(), split=split)

    def late_authorize(self, w: Worker, job_id: UUID) -> Op:
        """A worker paused past its lease: it renews (which works only while no takeover has
        committed) and retries cutoff 2."""
        renew, authorize = self.renew(w, job_id), self.authorize(w, job_id)

        def run():
            renewed = renew.run()
            return renewed, authorize.run() if renewed == "Renewed" else None

        def predict(m: Model):
            renewed = renew.predict(m)
            return renewed, authorize.predict(m) if renewed == "Renewed" else None

        def split(m: Model):
            renewed = renew.predict(m)
            reread = authorize.split(m) if renewed == "Renewed" else None
            return None if reread is None else (lambda later: (renewed, reread(later)))
        return Op(w.name, "renew then authorize", run, predict, split=split)
