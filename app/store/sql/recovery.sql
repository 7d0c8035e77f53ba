-- Recovery, reconciliation and correction. The scan only nominates; each takeover repeats every
-- condition the scan relied on, lease expiry included, so a renewal that commits after the scan makes
-- the takeover match nothing. Each records its event in the same statement.

-- name: recovery_requeue_expired
-- An expired Running attempt with no stop request, under the attempt cap, goes back to the queue with
-- its event and a new wake-up.
WITH requeued AS (
    UPDATE export_jobs
    SET status = 'Queued', attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL,
        woken_at = clock_timestamp()
    WHERE id = %(job_id)s AND status = 'Running' AND attempt_id = %(expired_attempt_id)s
      AND stop_request_id IS NULL AND attempt_count < %(max_attempts)s
      AND lease_expires_at < clock_timestamp()
    RETURNING id),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
    SELECT id, %(expired_attempt_id)s, 'RequeuedByRecovery', %(recovery_run_id)s, clock_timestamp() FROM requeued)
INSERT INTO outbox (message_id, kind, job_id, created_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM requeued
RETURNING job_id;

-- name: recovery_stop_expired
-- An expired Running attempt with a recorded stop request is stopped. Terminal states keep attempt_id
-- for audit; only a requeue clears it.
WITH stopped AS (
    UPDATE export_jobs
    SET status = 'Stopped', lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Running' AND attempt_id = %(expired_attempt_id)s
      AND stop_request_id IS NOT NULL
      AND lease_expires_at < clock_timestamp()
    RETURNING id, attempt_id)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
SELECT id, attempt_id, 'StoppedByRecovery', %(recovery_run_id)s, clock_timestamp() FROM stopped
RETURNING id;

-- name: recovery_exhaust_expired
-- An expired Running attempt that has used up its attempts fails.
WITH exhausted AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = 'AttemptsExhausted', lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Running' AND attempt_id = %(expired_attempt_id)s
      AND stop_request_id IS NULL AND attempt_count >= %(max_attempts)s
      AND lease_expires_at < clock_timestamp()
    RETURNING id, attempt_id)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
SELECT id, attempt_id, 'AttemptsExhausted', %(recovery_run_id)s, clock_timestamp() FROM exhausted
RETURNING id;

-- name: recovery_resolve_delivering
-- An expired Delivering attempt is resolved from evidence, decided before this statement: Completed only
-- on evidence that matches the expected file, otherwise OutcomeUnknown. Never Failed, never a retry.
WITH resolved AS (
    UPDATE export_jobs
    SET status = %(resolution)s, lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Delivering' AND attempt_id = %(expired_attempt_id)s
      AND lease_expires_at < clock_timestamp()
      AND %(resolution)s IN ('Completed', 'OutcomeUnknown')
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'ResolvedByRecovery', %(recovery_run_id)s, status || ': ' || %(evidence_summary)s,
       clock_timestamp()
FROM resolved
RETURNING id;

-- name: export_reconcile
-- OutcomeUnknown -> Completed, or Failed with NotDelivered on affirmative evidence. No lease condition:
-- recovery cleared the lease. One-shot per attempt: the unique index allows one Reconciled event.
WITH reconciled AS (
    UPDATE export_jobs
    SET status = %(resolution)s,
        failure_reason = CASE WHEN %(resolution)s = 'Failed' THEN 'NotDelivered' END
    WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'OutcomeUnknown'
      AND %(resolution)s IN ('Completed', 'Failed')
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Reconciled', %(reconciled_by)s, status || ': ' || %(evidence)s, clock_timestamp()
FROM reconciled
RETURNING id;

-- name: export_correct
-- A reconciliation operator corrects a recorded Completed or Failed, once per attempt, recording who and
-- why in the same statement. The role guard in schema.sql refuses it to every other role.
WITH corrected AS (
    UPDATE export_jobs
    SET status = %(corrected_status)s,
        failure_reason = CASE WHEN %(corrected_status)s = 'Failed' THEN %(failure_reason)s::text END
    WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = %(recorded_status)s AND status IN ('Completed', 'Failed')
      AND %(corrected_status)s IN ('Completed', 'Failed') AND %(corrected_status)s <> %(recorded_status)s
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Corrected', %(corrected_by)s,
       %(recorded_status)s || ' to ' || status || ': ' || %(evidence_ref)s || '; ' || %(why)s, clock_timestamp()
FROM corrected
RETURNING id;

-- name: sweeper_republish_due
-- Batched, so a large backlog never becomes one long transaction. SKIP LOCKED leaves rows another writer
-- is changing to the next sweep; the UPDATE re-checks Queued, so a job that left the queue gets nothing.
WITH due AS (
    SELECT id FROM export_jobs
    WHERE status = 'Queued' AND woken_at < clock_timestamp() - make_interval(secs => %(sweep_after_seconds)s)
    ORDER BY woken_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED),
swept AS (
    UPDATE export_jobs j
    SET woken_at = clock_timestamp(), sweep_count = j.sweep_count + 1
    FROM due
    WHERE j.id = due.id AND j.status = 'Queued'
    RETURNING j.id)
INSERT INTO outbox (message_id, kind, job_id, created_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM swept
RETURNING job_id;
