-- The job's life from creation to its attempt's terminal write. Every statement is conditional on
-- the state, version, attempt or lease it checked, and a transition inserts its event in the same
-- statement: the INSERT reads only the rows the UPDATE returned, so one inserted row means the
-- transition happened. A transition that gives the job an outcome (a terminal status, or OutcomeUnknown)
-- also tells the tenant's webhooks in the same statement (the CTE ``webhook``): one webhook_deliveries row
-- per live endpoint of the tenant, which the notifier sends after commit; for a tenant without an
-- endpoint the join finds nothing.

-- name: export_create
-- An original job, its deliveries row (the key's owner, with the file name it delivers under) and its
-- first wake-up, together or not at all. A schedule's export names its schedule and slot (the slot's row
-- is written in the same transaction) and, if incremental, the snapshot it sends the changes since.
WITH delivery AS (
    INSERT INTO deliveries (tenant_id, delivery_key, original_job_id, file_name)
    VALUES (%(tenant_id)s, %(delivery_key)s, %(job_id)s, %(file_name)s)),
created AS (
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by, woken_at,
                             schedule_id, schedule_slot, incremental, incremental_since)
    VALUES (%(job_id)s, %(tenant_id)s, 'Queued', 1, %(destination_id)s, %(delivery_key)s, %(created_by)s,
            clock_timestamp(), %(schedule_id)s, %(schedule_slot)s, %(incremental)s,
            %(incremental_since)s::pg_snapshot)
    RETURNING id)
INSERT INTO outbox (message_id, kind, job_id, created_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM created
RETURNING job_id;

-- name: export_create_replacement
-- A replacement of an original that is OutcomeUnknown or Failed for a reason proving nothing was
-- finalized. FOR UPDATE waits for a concurrent correction of the original, then re-checks its status.
-- A scheduled original's schedule, slot and incremental terms are carried on: the replacement delivers
-- the same changes, from a snapshot of its own.
WITH original AS (
    SELECT id, tenant_id, destination_id, delivery_key, schedule_id, schedule_slot, incremental,
           incremental_since
    FROM export_jobs
    WHERE tenant_id = %(tenant_id)s AND id = %(original_job_id)s AND replaces_job_id IS NULL
      AND (status = 'OutcomeUnknown'
           OR (status = 'Failed' AND failure_reason IN ('BuildFailed', 'AttemptsExhausted', 'NotDelivered')))
    FOR UPDATE),
created AS (
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, replaces_job_id,
                             created_by, replacement_reason, overwrite_agreement_ref, woken_at,
                             schedule_id, schedule_slot, incremental, incremental_since)
    SELECT %(job_id)s, tenant_id, 'Queued', 1, destination_id, delivery_key, id,
           %(created_by)s, %(replacement_reason)s, %(overwrite_agreement_ref)s, clock_timestamp(),
           schedule_id, schedule_slot, incremental, incremental_since
    FROM original
    RETURNING id)
INSERT INTO outbox (message_id, kind, job_id, created_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM created
RETURNING job_id;

-- name: export_edit_terms
-- Changes a queued job's destination: the version increments, so a worker holding the old terms fails
-- its claim, and a new wake-up (new message id) brings the job back for a fresh evaluation. woken_at is
-- the database's clock, never a client-side value. An edit to the destination the job already has
-- changes no term, so it matches nothing: no new version, no wake-up.
WITH edited AS (
    UPDATE export_jobs
    SET destination_id = %(destination_id)s, version = version + 1, woken_at = clock_timestamp()
    WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND status = 'Queued' AND version = %(expected_version)s
      AND destination_id IS DISTINCT FROM %(destination_id)s::uuid
    RETURNING id, version)
INSERT INTO outbox (message_id, kind, job_id, created_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM edited
RETURNING job_id, (SELECT version FROM edited) AS version;

-- name: export_reject
-- Queued -> Rejected by policy, for the evaluated version only. An edit in between makes this match
-- nothing, and the edit's own wake-up brings the job back for a fresh evaluation. The tenant's webhooks
-- are told in the same statement (as by every statement that gives a job an outcome).
WITH rejected AS (
    UPDATE export_jobs
    SET status = 'Rejected'
    WHERE id = %(job_id)s AND status = 'Queued' AND version = %(checked_version)s
    RETURNING id, tenant_id, attempt_id, status),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, r.tenant_id, r.id, r.attempt_id, r.status, NULL, 'policy'
    FROM rejected r JOIN webhook_endpoints w ON w.tenant_id = r.tenant_id AND w.removed_at IS NULL)
SELECT id FROM rejected;

-- name: export_claim
-- Cutoff 1: Queued -> Running for the checked version, with the lease and the attempt event.
WITH claimed AS (
    UPDATE export_jobs
    SET status = 'Running', attempt_id = %(attempt_id)s, attempt_count = attempt_count + 1,
        claimed_by = %(worker_id)s,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
    WHERE id = %(job_id)s AND status = 'Queued' AND version = %(checked_version)s
    RETURNING id, attempt_id, version, claimed_by)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, version, worker_id, recorded_at)
SELECT id, attempt_id, 'Claimed', version, claimed_by, clock_timestamp() FROM claimed
RETURNING id;

-- name: export_authorize_delivery
-- Cutoff 2: Running -> Delivering for this attempt, only with no stop request and a current lease; for a
-- replacement also only while its original is not Completed. FOR SHARE conflicts with a correction's
-- update of the original, so whichever commits first makes the other wait; this statement then re-checks.
-- The attempt's baseline listing (and any other evidence it gathered before cutoff 2) is appended in the
-- same statement, whoever owns the job and whether or not it is authorized: evidence never depends on
-- the transition, but a Delivering attempt always has its baseline, and one round trip and one commit
-- carry both. One INSERT, ordered, so the evidence's ids come before DeliveryAuthorized's, as they
-- would have had it been appended first. An incremental export also records the snapshot its build read.
WITH original_open AS (
    SELECT 1 FROM export_jobs
    WHERE tenant_id = %(tenant_id)s AND id = %(replaces_job_id)s::uuid AND status <> 'Completed'
    FOR SHARE),
authorized AS (
    UPDATE export_jobs
    SET status = 'Delivering',
        expected_file_name = %(final_name)s, expected_file_bytes = %(length)s, expected_file_sha256 = %(sha256)s,
        expected_profile_version = %(profile_version)s, expected_marker_name = %(marker_name)s,
        expected_marker = %(marker)s, expected_snapshot = %(snapshot)s::pg_snapshot,
        expected_delivery_mode = %(delivery_mode)s,
        delivery_authorized_at = clock_timestamp()
    WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
      AND stop_request_id IS NULL
      AND lease_expires_at > clock_timestamp()
      AND (%(replaces_job_id)s::uuid IS NULL OR EXISTS (SELECT 1 FROM original_open))   -- typed, so a null binds
    RETURNING id, attempt_id, delivery_authorized_at),
inserted AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
    SELECT job_id, attempt_id, kind, observed_by, detail, recorded_at FROM (
        SELECT j.id AS job_id, %(attempt_id)s::uuid AS attempt_id, 'DeliveryEvidence' AS kind,
               %(observed_by)s::text AS observed_by, e.detail, clock_timestamp() AS recorded_at, e.n AS position
        FROM export_jobs j CROSS JOIN unnest(%(evidence)s::text[]) WITH ORDINALITY AS e (detail, n)
        WHERE j.id = %(job_id)s
        UNION ALL
        SELECT id, attempt_id, 'DeliveryAuthorized', NULL, %(final_name)s, delivery_authorized_at, 9223372036854775807
        FROM authorized) AS events
    ORDER BY position
    RETURNING kind)
SELECT count(*) FILTER (WHERE kind = 'DeliveryAuthorized') AS transitions,
       count(*) FILTER (WHERE kind = 'DeliveryEvidence') AS evidence
FROM inserted;

-- name: export_lease_renew
-- Renewal deliberately does not check expiry: a slow worker keeps ownership until a takeover commits.
UPDATE export_jobs
SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status IN ('Running', 'Delivering')
RETURNING lease_expires_at;

-- name: export_finish_stopped
-- Running -> Stopped, only for this attempt and only with a recorded stop request, so no catch block
-- can turn a lease takeover into an operator's stop.
WITH stopped AS (
    UPDATE export_jobs
    SET status = 'Stopped', lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
      AND stop_request_id IS NOT NULL
    RETURNING id, attempt_id, tenant_id, status),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, s.tenant_id, s.id, s.attempt_id, s.status, NULL, 'worker'
    FROM stopped s JOIN webhook_endpoints w ON w.tenant_id = s.tenant_id AND w.removed_at IS NULL)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
SELECT id, attempt_id, 'Stopped', %(worker_id)s, %(stop_point)s, clock_timestamp() FROM stopped
RETURNING id;

-- name: export_finish_failed
-- Running -> Failed with a code, for this attempt, before cutoff 2, so nothing has left the process:
-- the build failed (BuildFailed), the destination check found the final name taken (FinalNameOccupied,
-- OriginalDelivered), or the partner refused the configuration or stayed unreachable past the deferral
-- budget (NotDelivered). A stop request recorded first wins: this matches nothing and the attempt
-- records Stopped. The cause class (transient, configuration, permanent) follows the code in the detail.
WITH failed AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = %(failure_reason)s, lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
      AND stop_request_id IS NULL
      AND %(failure_reason)s IN ('BuildFailed', 'FinalNameOccupied', 'OriginalDelivered', 'NotDelivered')
      AND (%(cause)s::text IS NULL OR %(cause)s::text IN ('transient', 'configuration', 'permanent'))
    RETURNING id, attempt_id, failure_reason, tenant_id, status),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, f.tenant_id, f.id, f.attempt_id, f.status, f.failure_reason, 'worker'
    FROM failed f JOIN webhook_endpoints w ON w.tenant_id = f.tenant_id AND w.removed_at IS NULL)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
SELECT id, attempt_id, 'Failed', %(worker_id)s,
       failure_reason || coalesce(' (' || %(cause)s::text || ')', '') || coalesce(': ' || %(detail)s::text, ''),
       clock_timestamp()
FROM failed
RETURNING id;

-- name: export_defer
-- Running -> Queued for this attempt: the partner could not be reached before cutoff 2 (refused, dropped,
-- timed out, no session free, or its circuit is open), so nothing has left the process. Only with no stop
-- request and a current lease. The wake-up is due after the backoff; woken_at is that due time, so the
-- sweeper counts from it. deferred_since keeps the first deferral, for the deferral budget.
WITH deferred AS (
    UPDATE export_jobs
    SET status = 'Queued', attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL,
        deferrals = deferrals + 1, deferred_since = coalesce(deferred_since, clock_timestamp()),
        last_deferral = %(cause)s,
        woken_at = clock_timestamp() + make_interval(secs => %(delay_seconds)s)
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
      AND stop_request_id IS NULL
      AND lease_expires_at > clock_timestamp()
    RETURNING id, woken_at),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, %(attempt_id)s, 'DeferredPartnerUnavailable', %(worker_id)s, %(cause)s, clock_timestamp()
    FROM deferred)
INSERT INTO outbox (message_id, kind, job_id, created_at, due_at)
SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), woken_at FROM deferred
RETURNING job_id, due_at;

-- name: export_finish_delivery
-- The delivering attempt's terminal write: Delivering -> Completed, Failed (with a code the destination
-- proved) or OutcomeUnknown. After a takeover it matches nothing; the evidence it carries is appended all
-- the same, in the same statement: what the attempt observed after cutoff 2 (the receipt, a refused
-- rename's fresh listing, a listing after an interruption) and its outcome, whoever owns the job now, so
-- recovery weighs it under its Delivering rule. One INSERT, ordered: the evidence first, then Finished.
-- A Failed outcome's cause class follows its code in the detail (``Failed NotDelivered (transient): ...``):
-- the retry policy reads it there.
WITH finished AS (
    UPDATE export_jobs
    SET status = %(outcome)s,
        failure_reason = CASE WHEN %(outcome)s = 'Failed' THEN %(failure_reason)s::text END,
        lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Delivering'
      AND %(outcome)s IN ('Completed', 'Failed', 'OutcomeUnknown')
      AND (%(outcome)s <> 'Failed'
           OR %(failure_reason)s::text IN ('NotDelivered', 'FinalNameOccupied', 'OriginalDelivered'))
      AND (%(cause)s::text IS NULL OR (%(outcome)s = 'Failed'
                                      AND %(cause)s::text IN ('transient', 'configuration', 'permanent')))
    RETURNING id, attempt_id, status, tenant_id, failure_reason),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, f.tenant_id, f.id, f.attempt_id, f.status, f.failure_reason, 'worker'
    FROM finished f JOIN webhook_endpoints w ON w.tenant_id = f.tenant_id AND w.removed_at IS NULL),
inserted AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, observed_by, detail, recorded_at)
    SELECT job_id, attempt_id, kind, worker_id, observed_by, detail, clock_timestamp() FROM (
        SELECT j.id AS job_id, %(attempt_id)s::uuid AS attempt_id, 'DeliveryEvidence' AS kind,
               NULL::text AS worker_id, %(observed_by)s::text AS observed_by, e.detail, e.n AS position
        FROM export_jobs j CROSS JOIN unnest(%(evidence)s::text[]) WITH ORDINALITY AS e (detail, n)
        WHERE j.id = %(job_id)s
        UNION ALL
        SELECT id, attempt_id, 'Finished', %(worker_id)s, NULL,
               status || coalesce(' ' || %(failure_reason)s::text, '') || coalesce(' (' || %(cause)s::text || ')', '')
               || coalesce(': ' || %(detail)s::text, ''),
               9223372036854775807
        FROM finished) AS events
    ORDER BY position
    RETURNING kind)
SELECT count(*) FILTER (WHERE kind = 'Finished') AS transitions,
       count(*) FILTER (WHERE kind = 'DeliveryEvidence') AS evidence
FROM inserted;

-- name: export_append_evidence
-- Delivery evidence, appended whoever owns the job now. It never touches the job row, so it cannot
-- change a status; it only needs the job to exist.
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, %(attempt_id)s, 'DeliveryEvidence', %(observed_by)s, %(detail)s, clock_timestamp()
FROM export_jobs
WHERE id = %(job_id)s
RETURNING id;

-- name: export_read_ownership
-- State and ownership read together, with the replacement's original, for the lost-response wrappers.
SELECT j.status, j.attempt_id, j.stop_request_id,
       coalesce(j.lease_expires_at > clock_timestamp(), false) AS lease_current,
       o.status AS original_status
FROM export_jobs j
LEFT JOIN export_jobs o ON o.tenant_id = j.tenant_id AND o.id = j.replaces_job_id
WHERE j.id = %(job_id)s;

-- name: export_reconcile
-- OutcomeUnknown -> Completed, or Failed with NotDelivered on affirmative evidence. No lease condition:
-- recovery cleared the lease. One-shot per attempt: the unique index allows one Reconciled event.
-- An original is not reconciled Completed once a replacement of it has passed cutoff 2 and may have
-- written the shared final name (Delivering, Completed or OutcomeUnknown): the same contacts build the
-- same bytes, so a file there cannot be told apart from the replacement's. A correction, with evidence
-- naming the original's attempt, remains. Found by the chaos soak (seed 11).
WITH reconciled AS (
    UPDATE export_jobs j
    SET status = %(resolution)s,
        failure_reason = CASE WHEN %(resolution)s = 'Failed' THEN 'NotDelivered' END
    WHERE j.tenant_id = %(tenant_id)s AND j.id = %(job_id)s AND j.attempt_id = %(attempt_id)s
      AND j.status = 'OutcomeUnknown'
      AND %(resolution)s IN ('Completed', 'Failed')
      AND NOT (%(resolution)s = 'Completed' AND j.replaces_job_id IS NULL AND EXISTS (
          SELECT 1 FROM export_jobs r
          WHERE r.tenant_id = j.tenant_id AND r.replaces_job_id = j.id
            AND r.delivery_authorized_at IS NOT NULL
            AND r.status IN ('Delivering', 'Completed', 'OutcomeUnknown')))
    RETURNING j.id, j.attempt_id, j.status, j.tenant_id, j.failure_reason),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, r.tenant_id, r.id, r.attempt_id, r.status, r.failure_reason, 'reconciliation'
    FROM reconciled r JOIN webhook_endpoints w ON w.tenant_id = r.tenant_id AND w.removed_at IS NULL)
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
    RETURNING id, attempt_id, status, tenant_id, failure_reason),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, c.tenant_id, c.id, c.attempt_id, c.status, c.failure_reason, 'correction'
    FROM corrected c JOIN webhook_endpoints w ON w.tenant_id = c.tenant_id AND w.removed_at IS NULL)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Corrected', %(corrected_by)s,
       %(recorded_status)s || ' to ' || status || ': ' || %(evidence_ref)s || '; ' || %(why)s, clock_timestamp()
FROM corrected
RETURNING id;
