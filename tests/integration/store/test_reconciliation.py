"""Reconciliation and correction: OutcomeUnknown is reconciled once per attempt, every Failed carries
one failure code and nothing else carries one, and a recorded Completed or Failed is corrected once,
by a reconciliation operator only, with who and why recorded in the same statement."""

from __future__ import annotations

import pytest
from psycopg import errors as pg

from app.store import export
from app.store.types import FailureCode, Role, Status
from tests.factories import Job
from tests.factories_more import States


@pytest.fixture
def states(seed) -> States:
    return States(seed)


@pytest.fixture
def reconciler(connect_as):
    return connect_as(Role.RECONCILER)


def _reconcile(conn, job: Job, resolution: Status, evidence: str = "partner listing") -> bool:
    return export.reconcile(conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=job.attempt_id,
                              resolution=resolution, evidence=evidence, reconciled_by="ops-dave")


def _correct(conn, job: Job, recorded: Status, corrected: Status, failure_reason: FailureCode | None = None,
             why: str = "the partner's acknowledgment says otherwise") -> bool:
    return export.correct(conn, tenant_id=job.tenant_id, job_id=job.id, attempt_id=job.attempt_id,
                            recorded_status=recorded, corrected_status=corrected, failure_reason=failure_reason,
                            evidence_ref="ticket-88", why=why, corrected_by="ops-carol")


# --- reconciliation ---------------------------------------------------------------------------------


def test_outcome_unknown_from_recovery_reconciled_to_completed_keeps_both_events(states, seed):
    job = states.outcome_unknown_by_recovery()
    bystander = states.outcome_unknown_by_recovery()
    untouched = seed.row(bystander)

    assert _reconcile(seed.conn, job, Status.COMPLETED, evidence="sha256 matches the expected file")

    assert seed.row(bystander) == untouched

    row = seed.row(job)
    assert (row["status"], row["failure_reason"]) == ("Completed", None)
    events = seed.events(job)
    assert [e["kind"] for e in events] == ["Claimed", "DeliveryAuthorized", "ResolvedByRecovery", "Reconciled"]
    assert events[-1]["observed_by"] == "ops-dave"
    assert events[-1]["detail"] == "Completed: sha256 matches the expected file"


def test_outcome_unknown_from_recovery_reconciled_to_failed_is_not_delivered_and_keeps_both_events(states, seed):
    job = states.outcome_unknown_by_recovery()

    assert _reconcile(seed.conn, job, Status.FAILED, evidence="partner: nothing published, slot revoked")

    row = seed.row(job)
    assert (row["status"], row["failure_reason"]) == ("Failed", "NotDelivered")
    assert seed.event_kinds(job) == ["Claimed", "DeliveryAuthorized", "ResolvedByRecovery", "Reconciled"]


def test_a_second_reconciliation_of_the_same_attempt_matches_nothing(states, seed):
    job = states.outcome_unknown_by_recovery()
    assert _reconcile(seed.conn, job, Status.COMPLETED)
    before = seed.row(job)

    assert not _reconcile(seed.conn, job, Status.FAILED)

    assert seed.row(job) == before
    assert seed.event_kinds(job).count("Reconciled") == 1


def test_a_second_reconciled_event_is_refused_by_uq_attempt_transition_even_if_the_row_were_unknown_again(
        states, seed, admin):
    job = states.outcome_unknown_by_recovery()
    assert _reconcile(seed.conn, job, Status.COMPLETED)
    # Only the owner could put the row back; the statement's event must still be refused.
    admin.execute("UPDATE export_jobs SET status = 'OutcomeUnknown' WHERE id = %s", (job.id,))

    assert not _reconcile(seed.conn, job, Status.FAILED)

    assert seed.status(job) is Status.OUTCOME_UNKNOWN   # the update and its event rolled back together
    assert seed.event_kinds(job).count("Reconciled") == 1


def test_a_second_reconciled_event_inserted_directly_is_refused_by_uq_attempt_transition(states, seed, admin):
    job = states.outcome_unknown_by_recovery()
    assert _reconcile(seed.conn, job, Status.COMPLETED)

    with pytest.raises(pg.UniqueViolation) as refused:
        admin.execute("INSERT INTO export_attempt_events (job_id, attempt_id, kind, recorded_at)"
                      " VALUES (%s, %s, 'Reconciled', clock_timestamp())", (job.id, job.attempt_id))

    assert refused.value.diag.constraint_name == "uq_attempt_transition"
    assert seed.event_kinds(job).count("Reconciled") == 1


# --- an original and its replacement share a final name (found by the chaos soak, seed 11) ----------


def _replacement_past_cutoff_2(states: States, seed, original: Job) -> Job:
    replacement = states.replacement(original)
    return seed.delivering(seed.running(replacement), replaces_job_id=original.id)


def test_an_original_is_not_reconciled_completed_once_its_replacement_passed_cutoff_2(states, seed):
    original = states.outcome_unknown_by_recovery()
    _replacement_past_cutoff_2(states, seed, original)
    before = seed.row(original)

    # The partner shows a file under the shared name with the expected bytes: the replacement's, maybe.
    assert not _reconcile(seed.conn, original, Status.COMPLETED, evidence="listing shows the expected file")

    assert seed.row(original) == before
    assert "Reconciled" not in seed.event_kinds(original)


@pytest.mark.parametrize("replacement_ended", [Status.COMPLETED, Status.OUTCOME_UNKNOWN])
def test_an_original_stays_unreconciled_while_its_replacement_may_have_written_the_file(states, seed,
                                                                                      replacement_ended):
    original = states.outcome_unknown_by_recovery()
    replacement = _replacement_past_cutoff_2(states, seed, original)
    assert export.try_finish_delivery(seed.conn, job_id=replacement.id, attempt_id=replacement.attempt_id,
                                      worker_id="worker-test", outcome=replacement_ended) == 1

    assert not _reconcile(seed.conn, original, Status.COMPLETED)
    # Failed stays open to affirmative evidence (the partner's word that nothing was published).
    assert _reconcile(seed.conn, original, Status.FAILED, evidence="partner: nothing published")


def test_an_original_is_reconciled_completed_when_its_replacement_proved_nothing_was_written(states, seed):
    original = states.outcome_unknown_by_recovery()
    replacement = _replacement_past_cutoff_2(states, seed, original)
    assert export.try_finish_delivery(seed.conn, job_id=replacement.id, attempt_id=replacement.attempt_id,
                                      worker_id="worker-test", outcome=Status.FAILED,
                                      failure_reason=FailureCode.NOT_DELIVERED) == 1

    assert _reconcile(seed.conn, original, Status.COMPLETED)


def test_an_original_is_reconciled_completed_while_its_replacement_has_not_reached_cutoff_2(states, seed):
    original = states.outcome_unknown_by_recovery()
    seed.running(states.replacement(original))

    assert _reconcile(seed.conn, original, Status.COMPLETED)


# --- every Failed has a code, nothing else has one (ck_export_jobs_failure) --------------------------


def test_a_failed_row_without_a_failure_code_is_refused(seed, admin):
    job = seed.running()

    with pytest.raises(pg.CheckViolation) as refused:
        admin.execute("UPDATE export_jobs SET status = 'Failed' WHERE id = %s", (job.id,))

    assert refused.value.diag.constraint_name == "ck_export_jobs_failure"
    assert seed.status(job) is Status.RUNNING


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.FAILED], ids=lambda s: s.value)
def test_a_row_in_any_other_status_with_a_failure_code_is_refused(seed, admin, status):
    job = seed.running()

    with pytest.raises(pg.CheckViolation) as refused:
        admin.execute("UPDATE export_jobs SET status = %s, failure_reason = 'NotDelivered' WHERE id = %s",
                      (status.value, job.id))

    assert refused.value.diag.constraint_name == "ck_export_jobs_failure"
    assert seed.row(job)["failure_reason"] is None


def test_a_correction_to_failed_without_a_failure_code_is_refused(seed, reconciler):
    job = seed.finished(Status.COMPLETED)

    with pytest.raises(pg.CheckViolation) as refused:
        _correct(reconciler, job, Status.COMPLETED, Status.FAILED, failure_reason=None)

    assert refused.value.diag.constraint_name == "ck_export_jobs_failure"
    assert seed.status(job) is Status.COMPLETED
    assert "Corrected" not in seed.event_kinds(job)


def test_a_correction_to_completed_drops_the_failure_code_so_no_completed_row_carries_one(states, seed, reconciler):
    job = states.failed(FailureCode.NOT_DELIVERED)

    assert _correct(reconciler, job, Status.FAILED, Status.COMPLETED, failure_reason=FailureCode.NOT_DELIVERED)

    row = seed.row(job)
    assert (row["status"], row["failure_reason"]) == ("Completed", None)


def test_a_completed_row_keeping_its_old_failure_code_is_refused(states, seed, admin):
    job = states.failed(FailureCode.NOT_DELIVERED)

    # What a correction statement that forgot to clear the code would write.
    with pytest.raises(pg.CheckViolation) as refused:
        admin.execute("UPDATE export_jobs SET status = 'Completed' WHERE id = %s", (job.id,))

    assert refused.value.diag.constraint_name == "ck_export_jobs_failure"
    assert seed.status(job) is Status.FAILED


# --- corrections -----------------------------------------------------------------------------------


def test_a_correction_changes_a_recorded_completed_once_and_records_who_and_why(seed, reconciler):
    job = seed.finished(Status.COMPLETED)
    bystander = seed.finished(Status.COMPLETED)
    untouched = seed.row(bystander)

    assert _correct(reconciler, job, Status.COMPLETED, Status.FAILED, FailureCode.NOT_DELIVERED,
                    why="the partner never received it")

    assert seed.row(bystander) == untouched

    row = seed.row(job)
    assert (row["status"], row["failure_reason"]) == ("Failed", "NotDelivered")
    corrected = seed.events(job)[-1]
    assert (corrected["kind"], corrected["attempt_id"], corrected["observed_by"]) == (
        "Corrected", job.attempt_id, "ops-carol")
    assert corrected["detail"] == "Completed to Failed: ticket-88; the partner never received it"


def test_a_reconciled_failure_is_corrected_to_completed_when_the_originals_file_turns_up(states, seed, reconciler):
    job = states.outcome_unknown_by_recovery()
    assert _reconcile(seed.conn, job, Status.FAILED)

    assert _correct(reconciler, job, Status.FAILED, Status.COMPLETED, why="a replacement found the original's file")

    assert seed.status(job) is Status.COMPLETED
    assert seed.event_kinds(job)[-3:] == ["ResolvedByRecovery", "Reconciled", "Corrected"]
    assert seed.events(job)[-1]["detail"] == "Failed to Completed: ticket-88; a replacement found the original's file"


def test_a_second_correction_back_is_refused_by_uq_attempt_transition_and_changes_nothing(seed, reconciler):
    job = seed.finished(Status.COMPLETED)
    assert _correct(reconciler, job, Status.COMPLETED, Status.FAILED, FailureCode.NOT_DELIVERED)
    before = seed.row(job)

    assert not _correct(reconciler, job, Status.FAILED, Status.COMPLETED)

    assert seed.row(job) == before
    assert seed.event_kinds(job).count("Corrected") == 1


def test_a_correction_from_a_status_no_longer_recorded_matches_nothing(seed, reconciler):
    job = seed.finished(Status.COMPLETED)
    assert _correct(reconciler, job, Status.COMPLETED, Status.FAILED, FailureCode.NOT_DELIVERED)
    before = seed.row(job)

    assert not _correct(reconciler, job, Status.COMPLETED, Status.FAILED, FailureCode.NOT_DELIVERED)

    assert seed.row(job) == before


def test_a_correction_of_an_unresolved_outcome_matches_nothing(states, seed, reconciler):
    job = states.outcome_unknown_by_recovery()
    before = seed.row(job)

    assert not _correct(reconciler, job, Status.OUTCOME_UNKNOWN, Status.COMPLETED)

    assert seed.row(job) == before


def test_a_correction_is_refused_for_the_application_role_by_the_guard_trigger(seed):
    job = seed.finished(Status.COMPLETED)
    before = seed.row(job)

    with pytest.raises(pg.InsufficientPrivilege, match="reconciliation operator"):
        _correct(seed.conn, job, Status.COMPLETED, Status.FAILED, FailureCode.NOT_DELIVERED)

    assert seed.row(job) == before
    assert "Corrected" not in seed.event_kinds(job)


def test_a_corrected_event_inserted_by_the_application_role_is_refused_by_the_guard_trigger(seed):
    job = seed.finished(Status.COMPLETED)

    with pytest.raises(pg.InsufficientPrivilege, match="reconciliation operator"):
        seed.conn.execute("INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)"
                          " VALUES (%s, %s, 'Corrected', 'ops-mallory', clock_timestamp())", (job.id, job.attempt_id))

    assert "Corrected" not in seed.event_kinds(job)
