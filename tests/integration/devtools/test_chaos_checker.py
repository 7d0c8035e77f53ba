"""The chaos soak's invariant checker: a history the protocol can produce, built through the real statements,
breaks no rule; a history forged to break one promise (rows written by the owner, triggers bypassed inside
the test alone, files written into a temporary partner directory, answers put into the ledger) is named by
that promise's rule, on that job, with the job's history."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from app.store import cancellation, export, recovery, relay, schedule
from app.store.schedule import Decided, RunOutcome, RunTrigger
from app.store.types import CancellationOutcome, ExpectedFile, FailureCode, Role, Status
from exports_devtools.chaos.checker import RULES, check, job_history
from exports_devtools.chaos.record import CancelAnswer, Ledger, Reconciliation, Violation
from exports_devtools.store import chaos
from tests.factories import Job, Seeder
from tests.factories_more import States

WORKER = "worker-chaos"
REMOTE_DIR = "/inbox"


@dataclass
class World:
    """A settled soak in miniature: jobs in every end state the protocol reaches, the partner's final files
    of the delivered ones, an empty local work directory and the ledger of what the operators were told."""

    seed: Seeder
    states: States
    admin: psycopg.Connection
    dispatcher: psycopg.Connection
    reconciler: psycopg.Connection
    root: Path
    work_dir: Path
    ledger: Ledger = field(default_factory=Ledger)
    renames: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)

    @property
    def conn(self) -> psycopg.Connection:
        return self.seed.conn

    def check(self) -> list[Violation]:
        return check(self.admin, partner_root=self.root, remote_dir=REMOTE_DIR, partner_renames=self.renames,
                     work_dirs=[self.work_dir], ledger=self.ledger)

    def fired(self) -> set[tuple[str, uuid.UUID | None]]:
        return {(v.rule, v.job_id) for v in self.check()}

    # --- the partner ---------------------------------------------------------------------------------

    def path(self, job: Job, directory: str = "inbox") -> Path:
        return self.root / directory / export.final_name(job.delivery_key)

    def rename_onto(self, job: Job, content: bytes, directory: str = "inbox") -> None:
        """What the partner sees of a rename onto the final name: the file, and one more rename counted
        under its path from the partner's root, as its journal names it."""
        self.path(job, directory).write_bytes(content)
        relative = f"/{directory}/{export.final_name(job.delivery_key)}"
        self.renames[relative] = self.renames.get(relative, 0) + 1

    # --- jobs through the real statements ------------------------------------------------------------

    def delivering(self, job: Job | None = None, content: bytes = b"id,email\n1,a@example.com\n",
                   replaces: Job | None = None, baseline: str | None = None) -> tuple[Job, bytes]:
        job = self.seed.running(job)
        if baseline is not None:
            assert export.append_evidence(self.conn, job_id=job.id, attempt_id=job.attempt_id, observed_by=WORKER,
                                          detail=baseline)
        expected = ExpectedFile(export.final_name(job.delivery_key), len(content), hashlib.sha256(content).digest())
        assert export.try_authorize_delivery(self.conn, job_id=job.id, tenant_id=job.tenant_id,
                                             attempt_id=job.attempt_id, expected=expected,
                                             replaces_job_id=replaces.id if replaces else None) == 1
        return job, content

    def finish(self, job: Job, outcome: Status, failure_reason: FailureCode | None = None) -> None:
        assert export.try_finish_delivery(self.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                                          outcome=outcome, failure_reason=failure_reason) == 1

    def completed(self, job: Job | None = None, content: bytes = b"id,email\n1,a@example.com\n",
                  directory: str = "inbox") -> Job:
        job, content = self.delivering(job, content)
        self.rename_onto(job, content, directory)
        self.finish(job, Status.COMPLETED)
        return job

    def outcome_unknown(self, content: bytes | None = None, baseline: str | None = None) -> Job:
        """Delivering, then OutcomeUnknown (the rename's reply was lost); ``content`` did reach the partner."""
        job, sent = self.delivering(content=content or b"id,email\n2,b@example.com\n", baseline=baseline)
        if content is not None:
            self.rename_onto(job, sent)
        self.finish(job, Status.OUTCOME_UNKNOWN)
        return job

    def reconcile(self, job: Job, *, by: str, evidence: str) -> None:
        assert export.reconcile(self.conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=job.attempt_id,
                                resolution=Status.COMPLETED, evidence=evidence, reconciled_by=by)

    def cancel(self, job: Job, request_id: uuid.UUID) -> CancelAnswer:
        result = cancellation.request_cancellation(self.conn, tenant_id=job.tenant_id, job_id=job.id,
                                                   request_id=request_id, requested_by="ops-bob")
        assert result.outcome is not None
        answer = CancelAnswer(job.id, request_id, result.outcome.value, time.time(),
                              result.found_status.value if result.found_status else None)
        self.ledger.add("cancels", answer)
        return answer

    def publish(self) -> None:
        """The relay's pass: every due row published (a deferral's later wake-up waits)."""
        due = relay.claim_batch(self.dispatcher, batch_size=10_000).rows
        relay.mark_published(self.dispatcher, message_ids=[m.message_id for m in due])


def _deferred(world: World, job: Job, delay_seconds: float) -> None:
    assert export.try_defer(world.conn, job_id=job.id, attempt_id=job.attempt_id, worker_id=WORKER,
                            cause="partner refused the connection", delay_seconds=delay_seconds) == 1


@pytest.fixture
def world(seed, admin, connect_as, tmp_path) -> World:
    (tmp_path / "partner" / "inbox").mkdir(parents=True)
    (tmp_path / "partner" / "archive").mkdir()
    (tmp_path / "work").mkdir()
    w = World(seed, States(seed), admin, connect_as(Role.DISPATCHER), connect_as(Role.RECONCILER),
              tmp_path / "partner", tmp_path / "work")

    w.jobs["completed"] = w.completed()

    # Deferred once, requeued by recovery once, then delivered: three claims, one deferral.
    retried = seed.running()
    _deferred(w, retried, 0)
    retried = seed.running(retried)
    seed.expire_lease(retried)
    assert recovery.requeue_expired(w.conn, [(retried.id, retried.attempt_id)], max_attempts=5,
                                    recovery_run_id="recovery-chaos") == [retried.id]
    w.jobs["retried"] = w.completed(retried, b"id,email\n3,c@example.com\n")

    # Still waiting out a deferral's backoff: Queued with a wake-up due later.
    waiting = seed.running()
    _deferred(w, waiting, 3600)
    w.jobs["waiting"] = waiting

    # Canceled with a double click (the same request id twice).
    canceled = seed.queued()
    request_id = uuid.uuid4()
    w.ledger.add("double_clicks", (w.cancel(canceled, request_id), w.cancel(canceled, request_id)))
    w.jobs["canceled"] = canceled

    stopped = seed.running()
    assert w.cancel(stopped, uuid.uuid4()).outcome == CancellationOutcome.STOP_REQUESTED
    assert export.try_finish_stopped(w.conn, job_id=stopped.id, attempt_id=stopped.attempt_id, worker_id=WORKER,
                                     stop_point="WhileBuilding") == 1
    w.jobs["stopped"] = stopped

    w.jobs["rejected"] = w.states.rejected()
    w.jobs["build_failed"] = w.states.failed(FailureCode.BUILD_FAILED)

    # OutcomeUnknown, reconciled by an operator citing the partner's listing.
    by_operator = w.outcome_unknown(b"id,email\n4,d@example.com\n")
    w.reconcile(by_operator, by="ops-carol", evidence="partner listing shows the file, size and hash")
    w.ledger.add("reconciliations", Reconciliation(by_operator.id, by_operator.attempt_id, "Completed",
                                                   "partner listing shows the file, size and hash"))
    w.jobs["by_operator"] = by_operator

    # OutcomeUnknown, reconciled by recovery from the evidence appended for the attempt.
    by_recovery = w.outcome_unknown(b"id,email\n5,e@example.com\n", baseline="baseline: absent")
    assert export.append_evidence(w.conn, job_id=by_recovery.id, attempt_id=by_recovery.attempt_id,
                                  observed_by="recovery-chaos", detail="inspected: name, size and hash match")
    w.reconcile(by_recovery, by="recovery-chaos", evidence="inspected listing matches")
    w.jobs["by_recovery"] = by_recovery

    # OutcomeUnknown and nothing at the partner: it waits for an operator.
    w.jobs["unknown"] = w.outcome_unknown()

    # Failed NotDelivered after cutoff 2, corrected to Completed when the partner's receipt turned up.
    corrected, content = w.delivering(content=b"id,email\n6,f@example.com\n")
    w.rename_onto(corrected, content)
    w.finish(corrected, Status.FAILED, FailureCode.NOT_DELIVERED)
    assert export.correct(w.reconciler, tenant_id=corrected.tenant_id, job_id=corrected.id,
                          attempt_id=corrected.attempt_id, recorded_status=Status.FAILED,
                          corrected_status=Status.COMPLETED, failure_reason=None, evidence_ref="receipt-7",
                          why="the partner's receipt names the file", corrected_by="ops-carol")
    w.jobs["corrected"] = corrected

    w.publish()
    return w


def _forge(admin: psycopg.Connection, statement: str, params: tuple) -> None:
    """A write no role may make, as the owner with every trigger off for this transaction alone."""
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute(statement, params)


# --- a clean history --------------------------------------------------------------------------------


def test_a_history_the_protocol_can_produce_breaks_no_rule(world):
    assert [(v.rule, v.job_id, v.detail) for v in world.check()] == []


def test_the_clean_history_holds_every_end_state_the_rules_judge(world):
    counts = chaos.counts_by_status(world.admin)

    assert counts == {"Queued": 1, "Canceled": 1, "Stopped": 1, "Rejected": 1, "Failed": 1, "Completed": 5,
                      "OutcomeUnknown": 1}
    assert chaos.status_of(world.admin, [world.jobs["retried"].id, uuid.uuid4()]) == {
        world.jobs["retried"].id: "Completed"}
    assert chaos.final_states(world.admin) == {"Queued": 1, "Canceled": 1, "Stopped": 1, "Rejected": 1,
                                               "Failed/BuildFailed": 1, "Completed": 5, "OutcomeUnknown": 1}
    # The waiting job's wake-up is the one row left, due in an hour.
    assert chaos.unpublished_outbox(world.admin) == 1
    assert chaos.unpublished_outbox(world.admin, due_only=True) == 0


# --- 1. two final files -----------------------------------------------------------------------------


def test_a_second_rename_onto_a_final_name_is_two_final_files(world):
    job = world.jobs["completed"]
    world.rename_onto(job, b"id,email\n1,a@example.com\n")

    assert world.fired() == {("two-final-files", job.id)}


def test_two_completed_jobs_of_one_key_without_an_agreement_are_two_final_files(world):
    original = world.outcome_unknown()
    replacement = world.states.replacement(original)
    world.completed(replacement, b"id,email\n7,g@example.com\n")
    # The database refuses to reconcile the original Completed now (its replacement passed cutoff 2); a
    # reconciliation operator's correction is the one way left to record it, mistaken or not.
    assert export.reconcile(world.conn, tenant_id=original.tenant_id, job_id=original.id,
                            attempt_id=original.attempt_id, resolution=Status.FAILED,
                            evidence="the partner says nothing arrived", reconciled_by="ops-carol")
    assert export.correct(world.reconciler, tenant_id=original.tenant_id, job_id=original.id,
                          attempt_id=original.attempt_id, recorded_status=Status.FAILED,
                          corrected_status=Status.COMPLETED, failure_reason=None, evidence_ref="ticket-7",
                          why="the partner says it got it after all", corrected_by="ops-rita")
    world.publish()

    assert ("two-final-files", replacement.id) in world.fired()


def test_an_overwrite_agreement_allows_a_replacement_to_finalize_the_name_again(world):
    original = world.outcome_unknown(b"id,email\n8,h@example.com\n")
    replacement = world.states.replacement(original, overwrite_agreement_ref="agreement-42")
    world.completed(replacement, b"id,email\n8,h@example.com,fixed\n")
    world.publish()

    assert world.fired() == set()


def _archive(world: World) -> uuid.UUID:
    """A second destination of the tenant, delivering to /archive on the same partner."""
    destination_id = world.seed.destination(world.jobs["completed"].tenant_id)
    world.admin.execute("UPDATE destinations SET remote_dir = '/archive' WHERE id = %s", (destination_id,))
    return destination_id


def test_a_key_finalized_in_two_destinations_directories_is_two_final_files(world):
    _archive(world)
    job = world.jobs["completed"]
    world.path(job, "archive").write_bytes(b"id,email\n1,a@example.com\n")

    assert world.fired() == {("two-final-files", job.id)}


def test_a_job_of_another_destination_is_judged_by_the_file_in_that_destinations_directory(world):
    destination_id = _archive(world)
    job = world.completed(world.seed.queued(world.jobs["completed"].tenant_id, destination_id),
                          b"id,email\n10,j@example.com\n", directory="archive")
    world.publish()

    assert world.fired() == set()
    world.path(job, "archive").write_bytes(b"id,email\n10,someone-else@example.com\n")
    assert world.fired() == {("completed-file-mismatch", job.id)}
    assert world.check()[0].history["partner_file"]["path"] == f"archive/{export.final_name(job.delivery_key)}"


# --- 2. files after a cancel ------------------------------------------------------------------------


def test_a_final_file_for_a_canceled_job_that_no_delivery_accounts_for_is_a_file_after_cancel(world):
    job = world.jobs["canceled"]
    world.path(job).write_bytes(b"id,email\n")

    assert world.fired() == {("file-after-cancel", job.id)}


def test_a_job_whose_cancel_was_answered_stop_requested_and_then_completed_is_a_file_after_cancel(world):
    job = world.jobs["completed"]
    world.ledger.add("cancels", CancelAnswer(job.id, uuid.uuid4(), "StopRequested", time.time(), "Running"))

    assert world.fired() == {("file-after-cancel", job.id)}


def test_a_recorded_canceled_while_queued_for_a_job_that_passed_cutoff_2_is_a_file_after_cancel(world):
    job = world.jobs["unknown"]
    _forge(world.admin, "INSERT INTO cancellation_requests (tenant_id, id, job_id, requested_by, outcome,"
           " found_status, found_attempt_count) VALUES (%s, %s, %s, 'ops-bob', 'CanceledWhileQueued', 'Queued', 0)",
           (job.tenant_id, uuid.uuid4(), job.id))

    assert world.fired() == {("file-after-cancel", job.id)}


def test_a_final_file_whose_key_no_job_has_is_unaccounted(world):
    (world.root / "inbox" / export.final_name("nobody")).write_bytes(b"id\n")

    assert world.fired() == {("unaccounted-final-file", None)}


def test_a_final_file_beside_a_failed_not_delivered_is_unaccounted(world):
    job, content = world.delivering()
    world.rename_onto(job, content)
    world.finish(job, Status.FAILED, FailureCode.NOT_DELIVERED)
    world.publish()

    assert world.fired() == {("unaccounted-final-file", job.id)}


# --- 3. completed files -----------------------------------------------------------------------------


def test_a_completed_job_whose_final_file_differs_is_a_mismatch_with_the_file_in_its_history(world):
    job = world.jobs["retried"]
    world.path(job).write_bytes(b"id,email\n3,someone-else@example.com\n")

    violations = world.check()

    assert [(v.rule, v.job_id) for v in violations] == [("completed-file-mismatch", job.id)]
    history = violations[0].history
    assert history["partner_file"]["sha256"] == hashlib.sha256(b"id,email\n3,someone-else@example.com\n").hexdigest()
    assert history["row"]["status"] == "Completed"
    assert [e["kind"] for e in history["events"]] == [
        "Claimed", "DeferredPartnerUnavailable", "Claimed", "RequeuedByRecovery", "Claimed", "DeliveryAuthorized",
        "Finished"]
    assert len(history["outbox"]) == 3
    json.dumps(violations[0].as_json())


def test_a_completed_job_whose_final_file_is_missing_is_a_mismatch(world):
    job = world.jobs["by_operator"]
    world.path(job).unlink()

    assert world.fired() == {("completed-file-mismatch", job.id)}


# --- 4. settled -------------------------------------------------------------------------------------


def test_a_job_left_running_or_queued_without_a_wakeup_ahead_is_unsettled(world):
    running = world.seed.running()
    queued = world.seed.queued()
    world.publish()

    assert world.fired() == {("unsettled-at-end", running.id), ("unsettled-at-end", queued.id)}


# --- 5. events --------------------------------------------------------------------------------------


def test_an_attempt_count_that_is_not_the_number_of_claims_is_an_event_mismatch(world):
    job = world.jobs["retried"]
    _forge(world.admin, "UPDATE export_jobs SET attempt_count = attempt_count - 1 WHERE id = %s", (job.id,))

    violations = world.check()

    assert [(v.rule, v.job_id) for v in violations] == [("event-mismatch", job.id)]
    assert "attempt_count 2, but 3 Claimed event(s)" in violations[0].detail


def test_a_claim_after_a_terminal_state_is_an_event_mismatch(world):
    job = world.jobs["completed"]
    world.admin.execute("INSERT INTO export_attempt_events (job_id, attempt_id, kind, recorded_at)"
                        " VALUES (%s, %s, 'Claimed', clock_timestamp())", (job.id, uuid.uuid4()))

    violations = world.check()

    assert [(v.rule, v.job_id) for v in violations] == [("event-mismatch", job.id)]
    assert "follows the terminal state Completed" in violations[0].detail


def test_a_status_no_event_proves_is_an_event_mismatch(world):
    job = world.jobs["build_failed"]
    _forge(world.admin, "UPDATE export_jobs SET status = 'Stopped', failure_reason = NULL WHERE id = %s", (job.id,))

    violations = world.check()

    assert [(v.rule, v.job_id) for v in violations] == [("event-mismatch", job.id)]
    assert "row Stopped, but the events leave it Failed" in violations[0].detail


def test_a_failure_code_the_events_do_not_record_is_an_event_mismatch(world):
    job = world.jobs["build_failed"]
    _forge(world.admin, "UPDATE export_jobs SET failure_reason = 'NotDelivered' WHERE id = %s", (job.id,))

    assert world.fired() == {("event-mismatch", job.id)}


def test_a_canceled_job_without_its_canceled_while_queued_request_is_an_event_mismatch(world):
    job = world.jobs["rejected"]
    _forge(world.admin, "UPDATE export_jobs SET status = 'Canceled' WHERE id = %s", (job.id,))

    assert world.fired() == {("event-mismatch", job.id)}


def test_evidence_appended_after_the_end_is_not_a_transition(world):
    job = world.jobs["stopped"]
    assert export.append_evidence(world.conn, job_id=job.id, attempt_id=job.attempt_id, observed_by="late",
                                  detail="listing: nothing")

    assert world.fired() == set()


# --- 6. evidence ------------------------------------------------------------------------------------


def test_a_reconciliation_with_no_evidence_before_it_is_resolved_without_evidence(world):
    job = world.jobs["unknown"]
    world.path(job).write_bytes(b"id,email\n2,b@example.com\n")
    world.reconcile(job, by="recovery-chaos", evidence="trust me")

    assert world.fired() == {("resolved-without-evidence", job.id)}


def test_a_reconciliation_on_the_baseline_listed_before_cutoff_2_alone_is_resolved_without_evidence(world):
    job = world.outcome_unknown(b"id,email\n9,i@example.com\n", baseline="baseline: absent")
    world.reconcile(job, by="recovery-chaos", evidence="baseline only")
    world.publish()

    violations = world.check()

    assert [(v.rule, v.job_id) for v in violations] == [("resolved-without-evidence", job.id)]
    assert [e["kind"] for e in violations[0].history["events"]] == [
        "Claimed", "DeliveryEvidence", "DeliveryAuthorized", "Finished", "Reconciled"]


def test_an_operators_reconciliation_that_cites_nothing_is_resolved_without_evidence(world):
    job = world.jobs["unknown"]
    world.path(job).write_bytes(b"id,email\n2,b@example.com\n")
    world.reconcile(job, by="ops-carol", evidence=" ")
    world.ledger.add("reconciliations", Reconciliation(job.id, job.attempt_id, "Completed", ""))

    assert world.fired() == {("resolved-without-evidence", job.id)}


# --- 7, 8, 9 ----------------------------------------------------------------------------------------


def test_a_double_click_answered_twice_differently_is_named(world):
    job = world.jobs["canceled"]
    request_id = uuid.uuid4()
    world.ledger.add("double_clicks", (CancelAnswer(job.id, request_id, "CanceledWhileQueued", time.time()),
                                       CancelAnswer(job.id, request_id, "AlreadyCanceled", time.time())))

    assert world.fired() == {("double-click-differs", job.id)}


def test_a_local_file_left_after_the_scavenger_is_an_orphan_of_the_job_it_names(world):
    job = world.jobs["stopped"]
    (world.work_dir / f"{job.id}.{job.attempt_id}.csv.part").write_bytes(b"id\n")

    assert world.fired() == {("orphan-local-file", job.id)}


def test_an_unpublished_wakeup_already_due_is_an_outbox_not_drained(world):
    job = world.seed.queued()
    world.cancel(job, uuid.uuid4())

    assert world.fired() == {("outbox-not-drained", job.id)}


def test_a_schedule_whose_cron_slot_was_never_decided_is_named(world):
    tenant_id = world.seed.tenant()
    schedule_id = uuid.uuid4()
    schedule.add(world.conn, schedule_id=schedule_id, tenant_id=tenant_id, cron="*/5 * * * * *", time_zone="UTC",
                 destination_id=world.seed.destination(tenant_id), incremental=False, next_fire_at=None,
                 changed_by="op-1")
    # Slots at :00 and :10 were decided; the one at :05 between them never was.
    schedule.record_runs(world.conn, schedule_id=schedule_id, trigger=RunTrigger.CRON, decided=[
        Decided(datetime(2025, 6, 1, 0, 0, second), datetime(2025, 6, 1, 0, 0, second, tzinfo=UTC),
                RunOutcome.MISSED, detail="forged") for second in (0, 10)])

    assert world.fired() == {("slot-not-once", None)}


def test_every_rule_has_a_test_that_fires_it():
    source = "".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_chaos_checker*.py"))

    assert [rule for rule in RULES if f'("{rule}"' not in source] == []


# --- the liveness reads and the history ----------------------------------------------------------------


def test_overdue_leases_names_the_attempts_whose_lease_ran_out_past_the_grace(world):
    overdue = world.seed.running()
    world.seed.running()
    world.seed.expire_lease(overdue, seconds_ago=120)

    rows = chaos.overdue_leases(world.admin, grace_seconds=60)

    assert [(r["id"], r["status"], r["claimed_by"]) for r in rows] == [(overdue.id, "Running", "worker-test")]
    assert rows[0]["overdue_seconds"] >= 120
    assert chaos.overdue_leases(world.admin, grace_seconds=600) == []


def test_stale_queued_counts_from_the_newest_wakeup_and_spares_a_deferral_still_ahead(world):
    stale = world.seed.queued()
    _forge(world.admin, "UPDATE outbox SET created_at = created_at - interval '10 minutes' WHERE job_id = %s",
           (stale.id,))

    rows = chaos.stale_queued(world.admin, older_than_seconds=300)

    assert [r["id"] for r in rows] == [stale.id]
    assert rows[0]["age_seconds"] >= 600 and rows[0]["last_wake_up"] < rows[0]["woken_at"]
    # The waiting job's newest wake-up is due in an hour: never stale before then.
    assert world.jobs["waiting"].id not in {r["id"] for r in chaos.stale_queued(world.admin, older_than_seconds=-60)}


def test_job_history_reads_the_row_events_outbox_cancellations_and_partner_file(world):
    job = world.jobs["canceled"]

    history = job_history(world.admin, job.id, world.root, REMOTE_DIR)

    assert history["row"]["status"] == "Canceled"
    assert history["events"] == []
    assert len(history["outbox"]) == 1 and history["outbox"][0]["published_at"] is not None
    assert [c["outcome"] for c in history["cancellations"]] == ["CanceledWhileQueued"]
    assert history["partner_file"] is None
    assert job_history(world.admin, uuid.uuid4(), world.root, REMOTE_DIR)["row"] is None



# --- completion markers ----------------------------------------------------------------------------------


def _marked(world, content: bytes = b"id,email\n11,m@example.com\n") -> tuple[Job, Path, bytes]:
    """A Completed job whose profile writes a marker: cutoff 2 recorded it, and both files are there."""
    job = world.seed.running()
    name = export.final_name(job.delivery_key)
    marker = json.dumps({"name": name, "bytes": len(content)}).encode()
    expected = ExpectedFile(name, len(content), hashlib.sha256(content).digest(), marker_name=name + ".manifest.json",
                            marker=marker)
    assert export.try_authorize_delivery(world.conn, job_id=job.id, tenant_id=job.tenant_id,
                                         attempt_id=job.attempt_id, expected=expected, replaces_job_id=None) == 1
    world.rename_onto(job, content)
    marker_path = world.path(job).with_name(name + ".manifest.json")
    marker_path.write_bytes(marker)
    world.finish(job, Status.COMPLETED)
    world.publish()
    return job, marker_path, marker


def test_a_completed_job_with_its_file_and_its_recorded_marker_breaks_no_rule(world):
    _marked(world)

    assert world.fired() == set()


def test_a_completed_job_whose_marker_is_missing_or_not_the_recorded_one_is_named(world):
    job, marker_path, marker = _marked(world)

    marker_path.write_bytes(marker + b" ")
    assert world.fired() == {("completed-file-mismatch", job.id)}
    marker_path.unlink()
    violations = world.check()
    assert [(v.rule, v.job_id) for v in violations] == [("completed-file-mismatch", job.id)]
    assert "completion marker" in violations[0].detail and "missing" in violations[0].detail


def _hook_for(world: World, job: Job, *, removed: bool, state: str) -> None:
    """An endpoint of the job's tenant (removed, or live) and a delivery of the job's Completed to it."""
    endpoint = uuid.uuid4()
    _forge(world.admin, "INSERT INTO webhook_endpoints (id, tenant_id, name, url, secret_ref, created_by, removed_by,"
                        " removed_at) VALUES (%s, %s, 'hooks', 'https://h.example/', 'env:H', 't', %s, %s)",
           (endpoint, job.tenant_id, "t" if removed else None, "now()" if removed else None))
    _forge(world.admin, "INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, status, source, state,"
                        " finished_at) VALUES (%s, %s, %s, 'Completed', 'worker', %s, %s)",
           (endpoint, job.tenant_id, job.id, state, None if state == "pending" else "now()"))


def test_a_webhook_told_of_a_tenant_without_a_live_endpoint_is_a_webhook_mismatch(world):
    job = world.jobs["completed"]
    _hook_for(world, job, removed=True, state="delivered")

    assert world.fired() == {("webhook-mismatch", job.id)}


def test_a_webhook_delivery_left_pending_is_webhook_undelivered(world):
    job = world.jobs["completed"]
    _hook_for(world, job, removed=False, state="pending")

    assert world.fired() == {("webhook-undelivered", job.id)}
