"""The protocol as a whole: concurrent actors against the real database, checked against a reference model.

Two workers (each with its own attempts, which go stale when another writer moves the job on), an
operator with two browser tabs, recovery, the sweeper and a reconciliation operator issue every
write of the protocol on several jobs at once: create, replace, edit, claim, renew, cutoff 2, the
terminal writes, evidence, cancel (and the same click again), lease expiry and wake-up ageing (the
owner writing the past, as tests/factories.py does), recovery's takeovers with stale nominations
and its whole run, the sweep, reconciliation and correction. Hypothesis picks which actor moves next.
Each answer is compared with the reference model (tests/integration/model/reference.py, written
from the reference design without the implementation), and after every step the whole database is
compared with the model and checked on its own account (tests/integration/model/database.py).

One rule runs two writers at once on one job, on two connections released together by a barrier,
and accepts the outcome only if it is what one of the two serial orders would have produced.

Reproduce a failure: the minimal program is printed; outside CI the seed is printed too
(EXPORTS_MODEL_SEED=<seed>). Under CI=true the run is derandomized. EXPORTS_MODEL_EXAMPLES sets the
number of examples (a longer hunt).
"""

from __future__ import annotations

import copy
import itertools
import hashlib
import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

import psycopg
from hypothesis import HealthCheck, Verbosity, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, get_state_machine_test, initialize, invariant,
                                 multiple, rule)

from app.delivery.destination import Evidence, EvidenceStage, Listing
from app.maintenance.recovery import Recovery, RecoveryConfig
from app.store import cancellation, export, recovery, sweeper, worker
from app.store.database import Database
from app.store.types import ExpectedFile, FailureCode, Role, Status
from tests.conftest import IN_CI
from tests.factories import Seeder
from tests.integration.model import database
from tests.integration.model.reference import (COMPLETED, DELIVERING, FAILED, OUTCOME_UNKNOWN, QUEUED,
                                               REPLACEABLE_FAILURES, RUNNING, SWEEP_AFTER_MINUTES, Job, Model)

MAX_ATTEMPTS = 2
#: Long enough that no lease expires by itself during a run: only the ``expire`` rule ages one.
LEASE_SECONDS = 600.0
FILE_SIZE = 123
OPERATORS = ("dana", "erin")
WORKERS = ("worker-1", "worker-2")
CODES = tuple(code.value for code in FailureCode)


# Where each race is run: a job in the state where the two writes really contend.
def _queued(m: Model, j: Job) -> bool:
    return j.status == QUEUED


def _running(m: Model, j: Job) -> bool:
    return j.status == RUNNING and j.stop_request is None


def _leased(m: Model, j: Job) -> bool:
    return j.status in (RUNNING, DELIVERING)


def _stopping(m: Model, j: Job) -> bool:
    return j.status == RUNNING and j.stop_request is not None


def _replacement_before_cutoff_2(m: Model, j: Job) -> bool:
    return j.status == RUNNING and j.original is not None and m.jobs[j.original].status in (COMPLETED, FAILED)


def _recorded_original(m: Model, j: Job) -> bool:
    return j.original is None and j.status in (COMPLETED, FAILED)


def _replaceable(m: Model, j: Job) -> bool:
    return j.original is None and (j.status == OUTCOME_UNKNOWN
                                   or (j.status == FAILED and j.failure in REPLACEABLE_FAILURES))


def _unknown_original(m: Model, j: Job) -> bool:
    return j.original is None and j.status == OUTCOME_UNKNOWN


#: Two writers at once, by kind: (first write, second write, where it is run, whether the job's
#: worker is paused past its lease first). A fixed table, so every run draws the same shape whatever
#: the earlier races' winners were.
RACES = {
    "two claims": ("claim", "other claim", _queued, False),
    "claim and cancel": ("claim", "cancel", _queued, False),
    "claim and edit": ("claim", "edit", _queued, False),
    "a double click from two tabs": ("cancel", "cancel again", _running, False),
    "cutoff 2 and cancel": ("authorize", "cancel", _running, False),
    "a late cutoff 2 and a takeover": ("renew then authorize", "takeover", _running, True),
    "renewal and takeover": ("renew", "takeover", _leased, True),
    "terminal write and takeover": ("finish", "takeover", _leased, True),
    "stop and takeover": ("stop", "takeover", _stopping, True),
    "renewal and a recovery run": ("renew", "recovery run", _leased, True),
    "cancel and a recovery run": ("cancel", "recovery run", _running, True),
    "terminal write and a recovery run": ("finish", "recovery run", _leased, True),
    "cutoff 2 and correction of the original": ("authorize", "correct original", _replacement_before_cutoff_2,
                                                False),
    "replacement and correction": ("replace", "correct original", _recorded_original, False),
    "two replacements": ("replace", "other replace", _replaceable, False),
    "replacement and reconciliation": ("replace", "reconcile original", _unknown_original, False),
}

SETTINGS = settings(
    max_examples=int(os.environ.get("EXPORTS_MODEL_EXAMPLES", "60")),
    stateful_step_count=50,
    deadline=None,
    derandomize=IN_CI,
    database=None,
    print_blob=False,
    verbosity=Verbosity.normal,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def expected_file(key: str, attempt: UUID) -> ExpectedFile:
    """The file an attempt builds: a rebuild can differ, so its hash is the attempt's own."""
    return ExpectedFile(export.final_name(key), FILE_SIZE, hashlib.sha256(attempt.bytes).digest())


def receipt(key: str, attempt: UUID, proves: bool) -> str:
    """A receipt the attempt appends: of its own file (name, size and checksum), or of a file whose
    size contradicts it."""
    wanted = expected_file(key, attempt)
    listing = Listing(wanted.name, present=True, size=wanted.size if proves else wanted.size + 1,
                      sha256=wanted.sha256, hash_source="check-file-name")
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


class ProtocolMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")
    clicks = Bundle("clicks")

    def __init__(self, env: Env):
        super().__init__()
        self.env = env
        database.empty(env.admin)
        self.model = Model(max_attempts=MAX_ATTEMPTS)
        self.tenants: list[UUID] = []
        self.tenant_destinations: dict[UUID, list[UUID]] = {}
        for name in ("Acme", "Globex"):
            tenant = env.seeder.tenant(name)
            self.tenants.append(tenant)
            self.tenant_destinations[tenant] = [env.seeder.destination(tenant) for _ in range(2)]
            self.model.destinations.update({d: tenant for d in self.tenant_destinations[tenant]})
        self.workers = {name: Worker(name, env.worker_dbs[name]) for name in WORKERS}
        self.nominations: list[tuple[UUID, UUID]] = []
        # Ids and keys counted, not random: a rerun of the same steps makes the same choices.
        self._ids = itertools.count(1)
        self.transitions = database.Transitions()

    def _new_id(self) -> UUID:
        return UUID(int=next(self._ids))

    def _attempt(self, w: Worker, job_id: UUID) -> UUID:
        """The attempt the worker holds for the job, or one that never claimed anything."""
        return w.attempts.get(job_id) or self._new_id()

    # --- running a write --------------------------------------------------------------------------

    def _do(self, op: Op) -> object:
        expected = op.predict(self.model)
        answer = op.run()
        assert answer == expected, f"{op.actor} {op.label}: the database answered {answer!r}, the model {expected!r}"
        op.after(answer)
        self._check()
        return answer

    def _check(self) -> None:
        """The database against the model, and on its own account since the last look."""
        now = database.snapshot(self.env.admin)
        problems = database.differences(now, self.model) + self.transitions.violations(now)
        assert not problems, "\n".join(problems)

    def _job(self, job_id: UUID):
        return self.model.jobs[job_id]

    def _other_tenant(self, tenant: UUID) -> UUID:
        return next(t for t in self.tenants if t != tenant)

    # --- the operator's writes --------------------------------------------------------------------

    def _create(self, job_id: UUID, tenant: UUID, destination: UUID, key: str) -> Op:
        def run():
            return export.create(self.env.operator, job_id=job_id, tenant_id=tenant, destination_id=destination,
                                 delivery_key=key, created_by="dana").value
        return Op("operator", "create", run, lambda m: m.create(job_id, tenant, destination, key))

    def _replace(self, conn: psycopg.Connection, new_id: UUID, tenant: UUID, original: UUID,
                 actor: str = "operator") -> Op:
        def run():
            return export.create_replacement(conn, job_id=new_id, tenant_id=tenant, original_job_id=original,
                                             created_by="dana", replacement_reason="the partner lost it").value
        return Op(actor, "replace", run, lambda m: m.create_replacement(new_id, tenant, original))

    def _edit(self, conn: psycopg.Connection, tenant: UUID, job_id: UUID, version: int, destination: UUID,
              actor: str = "operator") -> Op:
        def run():
            return export.edit_terms(conn, tenant_id=tenant, job_id=job_id, expected_version=version,
                                     destination_id=destination).result.value
        return Op(actor, f"edit v{version}", run, lambda m: m.edit(tenant, job_id, version, destination))

    def _cancel(self, conn: psycopg.Connection, click: Click, actor: str = "operator") -> Op:
        def run():
            result = cancellation.request_cancellation(conn, tenant_id=click.tenant, job_id=click.job,
                                                       request_id=click.request_id, requested_by=click.operator)
            return result.reply.value, result.outcome.value if result.outcome else None
        return Op(actor, "cancel", run,
                  lambda m: m.cancel(click.tenant, click.job, click.request_id, click.operator))

    def _reconcile(self, conn: psycopg.Connection, job_id: UUID, attempt: UUID | None, resolution: str,
                   actor: str = "operator") -> Op:
        tenant = self._job(job_id).tenant

        def run():
            if attempt is None:
                return False
            return export.reconcile(conn, tenant_id=tenant, job_id=job_id, attempt_id=attempt,
                                    resolution=Status(resolution), evidence="the partner's report",
                                    reconciled_by="rita")
        return Op(actor, f"reconcile to {resolution}", run, lambda m: m.reconcile(tenant, job_id, attempt, resolution))

    def _correct(self, conn: psycopg.Connection, job_id: UUID, attempt: UUID | None, recorded: str,
                 actor: str = "reconciler") -> Op:
        tenant = self._job(job_id).tenant
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

    def _read(self, w: Worker, job_id: UUID) -> int:
        with w.db.connection() as conn:
            view = worker.read_job(conn, job_id)
        job = self._job(job_id)
        assert (view.status.value, view.version) == (job.status, job.version), f"{w.name} read {view}"
        w.versions[job_id] = view.version
        return view.version

    def _claim(self, w: Worker, job_id: UUID, version: int) -> Op:
        attempt = self._new_id()

        def run():
            return export.claim(w.db, job_id=job_id, checked_version=version, attempt_id=attempt, worker_id=w.name,
                                lease_seconds=LEASE_SECONDS).value

        def after(answer):
            if answer == "Claimed":
                w.attempts[job_id] = attempt
        return Op(w.name, f"claim v{version}", run, lambda m: m.claim(job_id, version, attempt), after)

    def _authorize(self, w: Worker, job_id: UUID) -> Op:
        job, attempt = self._job(job_id), self._attempt(w, job_id)

        def run():
            return export.authorize_delivery(w.db, job_id=job_id, tenant_id=job.tenant, attempt_id=attempt,
                                             expected=expected_file(job.key, attempt),
                                             replaces_job_id=job.original).value
        def split(m: Model):
            before = m.jobs[job_id].status
            m.authorize(job_id, attempt)
            return None if m.jobs[job_id].status != before else (lambda later: later.authorize_reread(job_id, attempt))
        return Op(w.name, "authorize", run, lambda m: m.authorize(job_id, attempt), split=split)

    def _renew(self, w: Worker, job_id: UUID) -> Op:
        attempt = self._attempt(w, job_id)

        def run():
            with w.db.connection() as conn:
                return export.renew_lease(conn, job_id=job_id, attempt_id=attempt, lease_seconds=LEASE_SECONDS).value
        return Op(w.name, "renew", run, lambda m: m.renew(job_id, attempt))

    def _finish_stopped(self, w: Worker, job_id: UUID) -> Op:
        attempt = self._attempt(w, job_id)

        def run():
            return export.finish_stopped(w.db, job_id=job_id, attempt_id=attempt, worker_id=w.name,
                                         stop_point="WhileBuilding").value
        return Op(w.name, "finish stopped", run, lambda m: m.finish_stopped(job_id, attempt))

    def _finish_failed(self, w: Worker, job_id: UUID, code: str) -> Op:
        attempt = self._attempt(w, job_id)

        def run():
            return export.finish_failed(w.db, job_id=job_id, attempt_id=attempt, worker_id=w.name,
                                        failure_reason=FailureCode(code)).value
        return Op(w.name, f"finish failed {code}", run, lambda m: m.finish_failed(job_id, attempt, code))

    def _finish_delivery(self, w: Worker, job_id: UUID, outcome: str, code: str | None) -> Op:
        attempt = self._attempt(w, job_id)
        code = code if outcome == FAILED else None

        def run():
            return export.finish_delivery(w.db, job_id=job_id, attempt_id=attempt, worker_id=w.name,
                                          outcome=Status(outcome),
                                          failure_reason=FailureCode(code) if code else None).value
        return Op(w.name, f"finish delivery {outcome} {code or ''}", run,
                  lambda m: m.finish_delivery(job_id, attempt, outcome, code))

    def _evidence(self, w: Worker, job_id: UUID, proves: bool) -> Op:
        job, attempt = self._job(job_id), self._attempt(w, job_id)

        def run():
            with w.db.connection() as conn:
                return export.append_evidence(conn, job_id=job_id, attempt_id=attempt, observed_by=w.name,
                                              detail=receipt(job.key, attempt, proves))
        return Op(w.name, "append evidence", run, lambda m: m.append_evidence(job_id, attempt, proves))

    def _reject(self, w: Worker, job_id: UUID, version: int) -> Op:
        def run():
            with w.db.connection() as conn:
                return export.reject(conn, job_id=job_id, checked_version=version)
        return Op(w.name, f"reject v{version}", run, lambda m: m.reject(job_id, version))

    # --- recovery's writes ------------------------------------------------------------------------

    def _takeover(self, kind: str, job_id: UUID, attempt: UUID) -> Op:
        conn = self.env.maintenance
        common = dict(job_id=job_id, expired_attempt_id=attempt, recovery_run_id="model-run")
        job = self._job(job_id)
        resolution = COMPLETED if Model.proves_delivery(job, attempt) else OUTCOME_UNKNOWN
        if kind == "resolve as Failed":
            resolution = FAILED
        runs = {
            "requeue": lambda: recovery.requeue_expired(conn, max_attempts=MAX_ATTEMPTS, **common),
            "stop": lambda: recovery.stop_expired(conn, **common),
            "exhaust": lambda: recovery.exhaust_expired(conn, max_attempts=MAX_ATTEMPTS, **common),
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

    def _decided_takeover(self, job_id: UUID) -> Op:
        """The takeover recovery's rules pick for the job's current attempt, as a scan would nominate it."""
        job = self._job(job_id)
        if job.status == DELIVERING:
            kind = "resolve"
        elif job.stop_request is not None:
            kind = "stop"
        elif job.attempt_count < MAX_ATTEMPTS:
            kind = "requeue"
        else:
            kind = "exhaust"
        return self._takeover(kind, job_id, job.attempt or self._new_id())

    def _expire(self, job_id: UUID) -> None:
        self.env.seeder.expire_lease(self._job(job_id))
        self._job(job_id).lease = "expired"

    # --- which job a rule acts on ----------------------------------------------------------------

    def _target(self, job: UUID, replacement: bool) -> UUID:
        """The job drawn from the bundle, or its latest replacement when there is one. Every draw has
        the same shape whatever the state, so hypothesis can replay a run whose races went the other
        way (a replacement a race created is reached through its original, never added to a bundle)."""
        if replacement:
            replacements = [j.id for j in self.model.jobs.values() if j.original == job]
            if replacements:
                return replacements[-1]
        return job

    # --- rules: the operator ----------------------------------------------------------------------

    # --- rules: the operator ----------------------------------------------------------------------

    @initialize(target=jobs)
    def jobs_in_every_state(self):
        """Six exports, taken through the real writes (each checked against the model) to Queued,
        Running, Delivering, OutcomeUnknown, Failed (BuildFailed, so replaceable) and Completed, so
        every run starts with jobs where each writer has something to contend for."""
        w1, w2 = self.workers.values()
        tenant = self.tenants[0]
        created = []
        for path in ("queued", "running", "delivering", "unknown", "failed", "completed"):
            job = self._new_id()
            self._do(self._create(job, tenant, self.tenant_destinations[tenant][0], f"key-{next(self._ids)}"))
            created.append(job)
            w = w2 if path in ("delivering", "completed") else w1
            if path != "queued":
                self._do(self._claim(w, job, self._read(w, job)))
            if path in ("delivering", "unknown", "completed"):
                self._do(self._authorize(w, job))
            if path == "unknown":
                self._do(self._finish_delivery(w, job, OUTCOME_UNKNOWN, None))
            elif path == "completed":
                self._do(self._evidence(w, job, proves=True))
                self._do(self._finish_delivery(w, job, COMPLETED, None))
            elif path == "failed":
                self._do(self._finish_failed(w, job, "BuildFailed"))
        return multiple(*created)

    @rule(target=jobs, which=st.integers(0, 1), key=st.sampled_from(["fresh", "taken", "another tenant's"]),
          own_destination=st.booleans())
    def create(self, which, key, own_destination):
        tenant = self.tenants[which]
        keys = {"fresh": [], "taken": sorted(self.model.keys.get(tenant, ())),
                "another tenant's": sorted(self.model.keys.get(self._other_tenant(tenant), ()))}[key]
        delivery_key = keys[0] if keys else f"key-{next(self._ids)}"
        owner = tenant if own_destination else self._other_tenant(tenant)
        job_id = self._new_id()
        answer = self._do(self._create(job_id, tenant, self.tenant_destinations[owner][0], delivery_key))
        return job_id if answer == "Created" else multiple()

    @rule(job=jobs, of_replacement=st.booleans(), own_tenant=st.booleans())
    def replace(self, job, of_replacement, own_tenant):
        """A replacement of the original, or (refused) of a replacement or from another tenant."""
        original = self._target(job, of_replacement)
        tenant = self._job(original).tenant
        self._do(self._replace(self.env.operator, self._new_id(), tenant if own_tenant else self._other_tenant(tenant),
                               original))

    @rule(job=jobs, replacement=st.booleans(),
          how=st.sampled_from(["as read", "with a stale version", "to another tenant's destination"]))
    def edit(self, job, replacement, how):
        model_job = self._job(self._target(job, replacement))
        owner = self._other_tenant(model_job.tenant) if how == "to another tenant's destination" else model_job.tenant
        destination = next(d for d in self.tenant_destinations[owner] if d != model_job.destination)
        version = model_job.version - int(how == "with a stale version")
        self._do(self._edit(self.env.operator, model_job.tenant, model_job.id, version, destination))

    @rule(target=clicks, job=jobs, replacement=st.booleans(), operator=st.sampled_from(OPERATORS),
          own_tenant=st.sampled_from([True, True, True, False]))
    def cancel(self, job, replacement, operator, own_tenant):
        job = self._target(job, replacement)
        tenant = self._job(job).tenant
        click = Click(tenant if own_tenant else self._other_tenant(tenant), job, self._new_id(), operator)
        self._do(self._cancel(self.env.operator, click))
        return click

    @rule(click=clicks, how=st.sampled_from(["again", "again from the other tab", "for another job",
                                             "by another operator"]),
          job=jobs, replacement=st.booleans())
    def click_again(self, click, how, job, replacement):
        """The same request id again: the same click (a double click, or a retry after Busy) gets
        the answer recorded the first time and changes nothing; the id reused for another job or by
        another operator is a client error."""
        if how == "for another job":
            click = Click(click.tenant, self._target(job, replacement), click.request_id, click.operator)
        elif how == "by another operator":
            click = Click(click.tenant, click.job, click.request_id, next(o for o in OPERATORS if o != click.operator))
        first = self.model.requests.get((click.tenant, click.request_id))
        answer = self._do(self._cancel(self.env.operator_tab if how.endswith("tab") else self.env.operator, click))
        if first is not None and (first.job, first.requested_by) == (click.job, click.operator):
            assert answer == ("Recorded", first.outcome), f"a double click answered {answer}, first {first.outcome}"

    @rule(job=jobs, replacement=st.booleans(),
          write=st.sampled_from(["reconcile to Completed", "reconcile to Failed", "reconcile a stale attempt",
                                 "correct", "correct a stale attempt", "correct as the app role"]))
    def reconcile_or_correct(self, job, replacement, write):
        model_job = self._job(self._target(job, replacement))
        attempt = self._new_id() if "stale" in write else model_job.attempt
        if write.startswith("reconcile"):
            self._do(self._reconcile(self.env.operator, model_job.id, attempt,
                                     FAILED if write.endswith("Failed") else COMPLETED))
            return
        recorded = model_job.status if model_job.status in (COMPLETED, FAILED) else COMPLETED
        if write != "correct as the app role":
            self._do(self._correct(self.env.reconciler, model_job.id, attempt, recorded))
            return
        # The worker's and the API's role may not correct: the database refuses the change itself.
        op = self._correct(self.env.operator, model_job.id, attempt, recorded, actor="operator")
        try:
            answer = op.run()
        except psycopg.errors.InsufficientPrivilege:
            answer = "refused by the database"
        if self.model.correctable(model_job.tenant, model_job.id, attempt, recorded,
                                  FAILED if recorded == COMPLETED else COMPLETED):
            assert answer == "refused by the database"
        else:
            # Nothing to correct (or corrected once already): refused either way, nothing changes.
            assert answer in (False, "refused by the database")
        self._check()

    # --- rules: the workers -----------------------------------------------------------------------

    @rule(name=st.sampled_from(WORKERS), job=jobs, replacement=st.booleans(),
          write=st.sampled_from(["read", "claim as read earlier", "reject", "authorize", "renew", "finish stopped",
                                 "finish failed", "finish delivery", "append evidence"]),
          outcome=st.sampled_from([COMPLETED, OUTCOME_UNKNOWN, FAILED]), code=st.sampled_from(CODES),
          proves=st.booleans())
    def worker_writes(self, name, job, replacement, write, outcome, code, proves):
        """One write by a worker with the attempt and the version it holds, which may be stale: the
        job was edited, taken over, ended, or never claimed by it."""
        w, job = self.workers[name], self._target(job, replacement)
        ops: dict[str, Callable[[], Op]] = {
            "claim as read earlier": lambda: self._claim(w, job, w.versions.get(job) or self._read(w, job)),
            "reject": lambda: self._reject(w, job, w.versions.get(job) or self._read(w, job)),
            "authorize": lambda: self._authorize(w, job),
            "renew": lambda: self._renew(w, job),
            "finish stopped": lambda: self._finish_stopped(w, job),
            "finish failed": lambda: self._finish_failed(w, job, code),
            "finish delivery": lambda: self._finish_delivery(w, job, outcome, code),
            "append evidence": lambda: self._evidence(w, job, proves),
        }
        if write == "read":
            self._read(w, job)
        else:
            self._do(ops[write]())

    @rule(name=st.sampled_from(WORKERS), job=jobs, replacement=st.booleans(),
          receipt=st.sampled_from(["none", "of its own file", "of another file"]),
          outcome=st.sampled_from([COMPLETED, OUTCOME_UNKNOWN, FAILED]), code=st.sampled_from(CODES))
    def run_the_attempt(self, name, job, replacement, receipt, outcome, code):
        """The runner's path from where this worker believes it is: claim; or cutoff 2 (renewing once
        when the lease lapsed), then the delivery's evidence and terminal write, or the stop."""
        w, job = self.workers[name], self._target(job, replacement)
        if job not in w.attempts:
            self._do(self._claim(w, job, self._read(w, job)))
            return
        answer = self._do(self._authorize(w, job))
        if answer == "LeaseLapsed":
            # Still the owner, only late, if the renewal changes the row: then one retry.
            renewed = self._do(self._renew(w, job)) == "Renewed"
            answer = self._do(self._authorize(w, job)) if renewed else "NotOwner"
        if answer == "Authorized":
            if receipt != "none":
                self._do(self._evidence(w, job, receipt == "of its own file"))
            self._do(self._finish_delivery(w, job, outcome, code))
        elif answer == "StopRecorded":
            self._do(self._finish_stopped(w, job))
        elif answer == "OriginalCompleted":
            self._do(self._finish_failed(w, job, "OriginalDelivered"))
        if answer != "LeaseLapsed":
            del w.attempts[job]

    # --- rules: time, recovery and the sweeper ----------------------------------------------------

    @rule(job=jobs, replacement=st.booleans(),
          what=st.sampled_from(["its lease lapses", "its wake-up ages past the sweep threshold",
                                "its wake-up ages to just under it"]))
    def time_passes(self, job, replacement, what):
        """Only the owner may write the past: a worker paused past its lease, a lost wake-up."""
        model_job = self._job(self._target(job, replacement))
        if what == "its lease lapses":
            if model_job.lease is not None:
                self._expire(model_job.id)
            return
        minutes = SWEEP_AFTER_MINUTES + (1 if "past" in what else -1)
        self.env.seeder.age_wakeup(model_job, minutes)
        model_job.woken_minutes_ago = minutes

    @rule(what=st.sampled_from(["sweep", "scan", "take over", "run recovery"]), index=st.integers(0, 3),
          kind=st.sampled_from(["requeue", "stop", "exhaust", "resolve", "resolve as Failed"]))
    def maintenance(self, what, index, kind):
        """The sweeper, recovery's scan, a takeover of a nomination that may have gone stale since the
        scan (renewed, taken over, ended: each takeover repeats every condition the scan relied on),
        and recovery's whole run."""
        if what == "sweep":
            swept = sweeper.republish_due(self.env.maintenance, sweep_after_seconds=SWEEP_AFTER_MINUTES * 60)
            assert set(swept) == self.model.sweep()
        elif what == "scan":
            found = recovery.scan_expired(self.env.maintenance)
            assert {(e.job_id, e.attempt_id) for e in found} == self.model.expired()
            self.nominations.extend(sorted((e.job_id, e.attempt_id) for e in found))
        elif what == "take over":
            if self.nominations:
                self._do(self._takeover(kind, *self.nominations[-1 - index % len(self.nominations)]))
        else:
            self._do(self._recovery_run())
        self._check()

    def _recovery_run(self) -> Op:
        """Recovery's whole run (the destination is not inspected: only appended evidence counts)."""
        def run():
            counts = Recovery(self.env.recovery_db, RecoveryConfig(max_attempts=MAX_ATTEMPTS),
                              inspect_destination=lambda job: None).run_once()
            return {name: n for name, n in counts.as_fields().items() if n and name != "scanned"}

        def split(m: Model):
            nominations = m.recovery_scan()
            return (lambda later: later.recovery_take_over(nominations)) if nominations else None
        return Op("recovery", "run recovery", run, lambda m: m.recovery_run(), split=split)

    # --- two writers at once ----------------------------------------------------------------------

    def _owner(self, job_id: UUID) -> Worker | None:
        attempt = self._job(job_id).attempt
        return next((w for w in self.workers.values() if attempt and w.attempts.get(job_id) == attempt), None)

    def _late_authorize(self, w: Worker, job_id: UUID) -> Op:
        """A worker paused past its lease: it renews (which works only while no takeover has
        committed) and retries cutoff 2."""
        renew, authorize = self._renew(w, job_id), self._authorize(w, job_id)

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

    def _race(self, kind: str, w: Worker, job_id: UUID) -> tuple[Op, Op]:
        """The two contending writes of a race, built for the job as it is now."""
        job = self._job(job_id)
        other_worker = next(x for x in self.workers.values() if x is not w)
        click = Click(job.tenant, job_id, self._new_id(), OPERATORS[0])
        base = self._job(job.original) if job.original else job
        builders: dict[str, Callable[[], Op]] = {
            "claim": lambda: self._claim(w, job_id, self._read(w, job_id)),
            "other claim": lambda: self._claim(other_worker, job_id, self._read(other_worker, job_id)),
            "cancel": lambda: self._cancel(self.env.operator, click),
            # The same click from a second tab at the same moment.
            "cancel again": lambda: self._cancel(self.env.operator_tab, click, actor="operator tab"),
            "edit": lambda: self._edit(self.env.operator_tab, job.tenant, job_id, job.version,
                                       next(d for d in self.tenant_destinations[job.tenant] if d != job.destination),
                                       actor="operator tab"),
            "authorize": lambda: self._authorize(w, job_id),
            "renew then authorize": lambda: self._late_authorize(w, job_id),
            "renew": lambda: self._renew(w, job_id),
            "finish": lambda: (self._finish_delivery(w, job_id, COMPLETED, None) if job.status == DELIVERING
                               else self._finish_failed(w, job_id, "BuildFailed")),
            "stop": lambda: self._finish_stopped(w, job_id),
            "takeover": lambda: self._decided_takeover(job_id),
            "recovery run": self._recovery_run,
            "correct original": lambda: self._correct(self.env.reconciler, base.id, base.attempt,
                                                      base.status if base.status in (COMPLETED, FAILED) else FAILED),
            "replace": lambda: self._replace(self.env.operator_tab, self._new_id(), base.tenant, base.id,
                                             actor="operator tab"),
            "other replace": lambda: self._replace(self.env.operator, self._new_id(), base.tenant, base.id),
            "reconcile original": lambda: self._reconcile(self.env.operator, base.id, base.attempt, COMPLETED),
        }
        first, second, _, _ = RACES[kind]
        return builders[first](), builders[second]()

    @rule(kind=st.sampled_from(sorted(RACES)), index=st.integers(0, 7), name=st.sampled_from(WORKERS),
          job=jobs, replacement=st.booleans())
    def race(self, kind, index, name, job, replacement):
        """Two actors write at once on two connections, released by a barrier, on a job where the
        two writes contend (any drawn job when none is in that state). Whichever commits first, the
        answers and the database must be what one of the two serial orders gives."""
        _, _, fits, pause = RACES[kind]
        candidates = [j.id for j in self.model.jobs.values() if fits(self.model, j)]
        job = candidates[index % len(candidates)] if candidates else self._target(job, replacement)
        if pause and self._job(job).lease is not None:
            self._expire(job)
        a, b = self._race(kind, self._owner(job) or self.workers[name], job)
        orders = []
        for first, second in ((a, b), (b, a)):
            model = copy.deepcopy(self.model)
            answers = {id(first): first.predict(model), id(second): second.predict(model)}
            orders.append((model, (answers[id(a)], answers[id(b)]), f"{first.label} then {second.label}"))
            if first.split is not None:
                # The first's first step, the second writer, then the rest of the first.
                model = copy.deepcopy(self.model)
                reread = first.split(model)
                if reread is not None:
                    answers = {id(second): second.predict(model)}
                    answers[id(first)] = reread(model)
                    orders.append((model, (answers[id(a)], answers[id(b)]),
                                   f"{first.label} begun, {second.label}, then the rest of {first.label}"))

        barrier = threading.Barrier(2)

        def write(op: Op) -> object:
            barrier.wait(timeout=30)
            return op.run()

        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(write, op) for op in (a, b)]
            answers = tuple(f.result(timeout=60) for f in futures)
        now = database.snapshot(self.env.admin)
        accepted = [model for model, expected, _ in orders
                    if expected == answers and not database.differences(now, model)]
        assert accepted, (
            f"{a.actor} {a.label} || {b.actor} {b.label} answered {answers}, which no serial order gives:\n"
            + "\n".join(f"  {name}: answers {expected}, differences {database.differences(now, model)}"
                        for model, expected, name in orders))
        self.model = accepted[0]
        a.after(answers[0])
        b.after(answers[1])
        self._check()

    # --- after every step ------------------------------------------------------------------------

    @invariant()
    def the_database_is_what_the_model_says(self):
        self._check()


def _run(env: Env) -> None:
    machine_test = get_state_machine_test(lambda: ProtocolMachine(env), settings=SETTINGS)
    if IN_CI:
        machine_test()   # derandomized: the same examples on every CI run
        return
    chosen = int(os.environ.get("EXPORTS_MODEL_SEED") or random.getrandbits(32))
    try:
        seed(chosen)(machine_test)()
    except BaseException as exc:
        exc.add_note(f"reproduce with EXPORTS_MODEL_SEED={chosen}")
        raise


def test_concurrent_actors_keep_the_database_what_the_reference_model_says(db_url, admin, connect_as):
    with (Database(db_url, Role.APP, max_size=2, name="worker-1") as w1,
          Database(db_url, Role.APP, max_size=2, name="worker-2") as w2,
          Database(db_url, Role.APP, max_size=2, name="recovery") as recovery_db):
        env = Env(admin=admin, seeder=Seeder(connect_as(Role.APP), admin), operator=connect_as(Role.APP),
                  operator_tab=connect_as(Role.APP), reconciler=connect_as(Role.RECONCILER),
                  maintenance=connect_as(Role.APP), worker_dbs={"worker-1": w1, "worker-2": w2},
                  recovery_db=recovery_db)
        _run(env)
