-- Recording a cancellation request: one short transaction with one locking read, one lookup, at most
-- one update and one insert. The row lock is what makes the classification true.

-- name: cancellation_lock_job
-- Every column of the job, in the order of the peewee model (a test compares them), locked until commit.
SELECT id, tenant_id, status, version, destination_id, attempt_id, attempt_count, claimed_by,
       lease_expires_at, stop_request_id, cancellation_request_id, expected_file_name,
       expected_file_bytes, expected_file_sha256, delivery_authorized_at, woken_at, failure_reason,
       delivery_key, replaces_job_id, created_by, replacement_reason, overwrite_agreement_ref,
       sweep_count, created_at, deferrals, deferred_since, last_deferral, expected_profile_version,
       expected_marker_name, expected_marker, schedule_id, schedule_slot, incremental,
       incremental_since::text, expected_snapshot::text, expected_delivery_mode
FROM export_jobs WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s
FOR UPDATE;

-- name: cancellation_find_request
SELECT tenant_id, id, job_id, requested_by, reason, outcome, found_status, found_attempt_id,
       found_attempt_count, found_delivery_authorized_at, recorded_at
FROM cancellation_requests WHERE tenant_id = %(tenant_id)s AND id = %(request_id)s;

-- name: cancellation_cancel_queued
-- Queued -> Canceled, with the tenant's webhooks told in the same statement.
WITH canceled AS (
    UPDATE export_jobs
    SET status = 'Canceled', cancellation_request_id = %(request_id)s
    WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s AND status = 'Queued'
    RETURNING id, tenant_id, attempt_id, status),
webhook AS (
    INSERT INTO webhook_deliveries (endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source)
    SELECT w.id, c.tenant_id, c.id, c.attempt_id, c.status, NULL, 'cancellation'
    FROM canceled c JOIN webhook_endpoints w ON w.tenant_id = c.tenant_id AND w.removed_at IS NULL)
SELECT id FROM canceled;

-- name: cancellation_request_stop
-- Records the first stop request; a trigger notifies the attempt's watcher at commit.
UPDATE export_jobs
SET stop_request_id = %(request_id)s
WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s AND status = 'Running' AND stop_request_id IS NULL
RETURNING id;

-- name: cancellation_record
INSERT INTO cancellation_requests (tenant_id, id, job_id, requested_by, reason, outcome, found_status,
                                   found_attempt_id, found_attempt_count, found_delivery_authorized_at)
VALUES (%(tenant_id)s, %(request_id)s, %(job_id)s, %(requested_by)s, %(reason)s, %(outcome)s, %(found_status)s,
        %(found_attempt_id)s, %(found_attempt_count)s, %(found_delivery_authorized_at)s)
RETURNING recorded_at;
