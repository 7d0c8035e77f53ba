-- Recovery: the scan only nominates; each takeover repeats every condition the scan relied on, lease
-- expiry included, so a renewal that commits after the scan makes the takeover match nothing. Each
-- records its event in the same statement, and one that gives the job an outcome tells the tenant's
-- webhooks there too.

-- name: recovery_scan_expired
-- Nominates only: every takeover repeats these conditions in its own write. The bound is read once
-- (a scalar subquery), so it is an index condition on ix_export_jobs_lease; a bare clock_timestamp()
-- is volatile and would be re-evaluated against every Running and Delivering row.
SELECT id, tenant_id, attempt_id, status, stop_request_id, attempt_count, deferrals, replaces_job_id,
       expected_file_name, expected_file_bytes, expected_file_sha256, expected_marker_name, expected_marker,
       destination_id, expected_delivery_mode
FROM export_jobs
WHERE status IN ('Running', 'Delivering') AND lease_expires_at < (SELECT clock_timestamp())
ORDER BY lease_expires_at
LIMIT %(batch_size)s;

-- The three takeovers of an expired Running attempt each take a batch of nominations, (job, attempt)
-- pairs, and repeat every condition for each row. The nominated rows are locked in id order first, so
-- two recoveries (or a recovery and any writer of one row) never deadlock, and a renewal or a late
-- authorization that holds a row makes the takeover wait and then re-evaluate, as a single-row write
-- would. Each row taken over inserts its own event.

-- The attempt cap counts the claims that did not end in a deferral (attempt_count - deferrals): a job
-- deferred through a long partner outage has used none of its attempts, and one whose worker keeps
-- crashing still ends at the cap.

-- name: recovery_requeue_expired
-- An expired Running attempt with no stop request, under the attempt cap, goes back to the queue with
-- its event and a new wake-up.
WITH nominated AS (
    SELECT job_id, attempt_id FROM unnest(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[]) AS n (job_id, attempt_id)),
locked AS (
    SELECT j.id FROM export_jobs j JOIN nominated n ON j.id = n.job_id
    ORDER BY j.id
    FOR UPDATE OF j),
requeued AS (
    UPDATE export_jobs j
    SET status = 'Queued', attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL,
        woken_at = clock_timestamp()
    FROM nominated n
    WHERE j.id = n.job_id AND j.id IN (SELECT id FROM locked)
      AND j.status = 'Running' AND j.attempt_id = n.attempt_id
      AND j.stop_request_id IS NULL AND j.attempt_count - j.deferrals < %(max_attempts)s
      AND j.lease_expires_at < clock_timestamp()
    RETURNING j.id, n.attempt_id),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
    SELECT id, attempt_id, 'RequeuedByRecovery', %(recovery_run_id)s, clock_timestamp() FROM requeued)
INSERT INTO outbox (message_id, kind, job_id, created_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM requeued
RETURNING job_id;

-- name: recovery_stop_expired
-- An expired Running attempt with a recorded stop request is stopped. Terminal states keep attempt_id
-- for audit; only a requeue clears it.
WITH nominated AS (
    SELECT job_id, attempt_id FROM unnest(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[]) AS n (job_id, attempt_id)),
locked AS (
    SELECT j.id FROM export_jobs j JOIN nominated n ON j.id = n.job_id
    ORDER BY j.id
    FOR UPDATE OF j),
stopped AS (
    UPDATE export_jobs j
    SET status = 'Stopped', lease_expires_at = NULL
    FROM nominated n
    WHERE j.id = n.job_id AND j.id IN (SELECT id FROM locked)
      AND j.status = 'Running' AND j.attempt_id = n.attempt_id
      AND j.stop_request_id IS NOT NULL
      AND j.lease_expires_at < clock_timestamp()
    RETURNING j.id, j.attempt_id, j.tenant_id, j.status),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, s.tenant_id, s.id, s.attempt_id, s.status, NULL, 'recovery'
    FROM stopped s JOIN webhook_endpoints w ON w.tenant_id = s.tenant_id AND w.removed_at IS NULL)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
SELECT id, attempt_id, 'StoppedByRecovery', %(recovery_run_id)s, clock_timestamp() FROM stopped
RETURNING job_id;

-- name: recovery_exhaust_expired
-- An expired Running attempt that has used up its attempts fails.
WITH nominated AS (
    SELECT job_id, attempt_id FROM unnest(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[]) AS n (job_id, attempt_id)),
locked AS (
    SELECT j.id FROM export_jobs j JOIN nominated n ON j.id = n.job_id
    ORDER BY j.id
    FOR UPDATE OF j),
exhausted AS (
    UPDATE export_jobs j
    SET status = 'Failed', failure_reason = 'AttemptsExhausted', lease_expires_at = NULL
    FROM nominated n
    WHERE j.id = n.job_id AND j.id IN (SELECT id FROM locked)
      AND j.status = 'Running' AND j.attempt_id = n.attempt_id
      AND j.stop_request_id IS NULL AND j.attempt_count - j.deferrals >= %(max_attempts)s
      AND j.lease_expires_at < clock_timestamp()
    RETURNING j.id, j.attempt_id, j.tenant_id, j.status, j.failure_reason),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, e.tenant_id, e.id, e.attempt_id, e.status, e.failure_reason, 'recovery'
    FROM exhausted e JOIN webhook_endpoints w ON w.tenant_id = e.tenant_id AND w.removed_at IS NULL)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
SELECT id, attempt_id, 'AttemptsExhausted', %(recovery_run_id)s, clock_timestamp() FROM exhausted
RETURNING job_id;

-- name: recovery_resolve_delivering
-- An expired Delivering attempt is resolved from evidence, decided before this statement: Completed only
-- on evidence that matches the expected file, otherwise OutcomeUnknown. Never Failed, never a retry.
WITH resolved AS (
    UPDATE export_jobs
    SET status = %(resolution)s, lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Delivering' AND attempt_id = %(expired_attempt_id)s
      AND lease_expires_at < clock_timestamp()
      AND %(resolution)s IN ('Completed', 'OutcomeUnknown')
    RETURNING id, attempt_id, status, tenant_id),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, r.tenant_id, r.id, r.attempt_id, r.status, NULL, 'recovery'
    FROM resolved r JOIN webhook_endpoints w ON w.tenant_id = r.tenant_id AND w.removed_at IS NULL)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'ResolvedByRecovery', %(recovery_run_id)s, status || ': ' || %(evidence_summary)s,
       clock_timestamp()
FROM resolved
RETURNING id;
-- name: recovery_read_evidence
-- The delivery evidence an attempt appended (or recovery appended for it), in the order it was appended.
SELECT detail
FROM export_attempt_events
WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND kind = 'DeliveryEvidence'
ORDER BY id;

-- name: recovery_scan_outcome_unknown
-- A page of OutcomeUnknown jobs, keyset-paged by id, for reconciliation from appended evidence, each with
-- the id of its attempt's newest event (an index-only look at ix_export_attempt_events_attempt): a job
-- whose evidence was judged at that id need not be read again until something is appended.
SELECT j.id, j.tenant_id, j.attempt_id, j.replaces_job_id, j.expected_file_name, j.expected_file_bytes,
       j.expected_file_sha256, j.expected_marker_name, j.expected_marker, j.destination_id, j.expected_delivery_mode,
       (SELECT max(e.id) FROM export_attempt_events e
        WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id) AS last_event_id
FROM export_jobs j
WHERE j.status = 'OutcomeUnknown' AND (%(after)s::uuid IS NULL OR j.id > %(after)s::uuid)
ORDER BY j.id
LIMIT %(batch_size)s;

-- Inspections of the partner for an expired delivery are claimed, so however many schedulers run, one
-- inspects a given attempt: a session-level advisory lock keyed by the attempt, taken without waiting and
-- held until that scheduler's resolution is written; a scheduler that dies releases it with its session.

-- name: recovery_claim_inspection
SELECT pg_try_advisory_lock(%(lock_class)s, hashtext(%(attempt_id)s::text)) AS claimed;

-- name: recovery_still_expired_delivering
-- Re-read after the claim: another scheduler may have resolved it between this one's scan and its claim.
SELECT EXISTS (
    SELECT 1 FROM export_jobs
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Delivering'
      AND lease_expires_at < clock_timestamp()) AS expired;

-- name: recovery_release_inspection
SELECT pg_advisory_unlock(%(lock_class)s, hashtext(%(attempt_id)s::text)) AS released;
