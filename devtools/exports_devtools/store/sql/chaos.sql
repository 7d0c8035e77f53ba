-- The chaos soak's reads, as the database owner (test equipment only, never the product): the whole
-- history its invariant checker judges once the system has settled, one job's history for a report,
-- and the liveness reads it polls while faults are injected. None of them writes.

-- name: chaos_snapshot
-- The checker reads every table in one snapshot, so a late write cannot make two reads disagree.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: chaos_jobs
-- Every job, or the one job_id names, with the directory of its destination, where its final file is put,
-- and the file name kept with its delivery key.
SELECT j.id, j.tenant_id, j.status, j.version, j.destination_id, j.attempt_id, j.attempt_count, j.claimed_by,
       j.lease_expires_at, j.stop_request_id, j.cancellation_request_id, j.expected_file_name,
       j.expected_file_bytes, j.expected_file_sha256, j.delivery_authorized_at, j.woken_at, j.failure_reason,
       j.delivery_key, j.replaces_job_id, j.created_by, j.replacement_reason, j.overwrite_agreement_ref,
       j.sweep_count, j.created_at, j.deferrals, j.deferred_since, j.last_deferral, j.expected_profile_version,
       j.expected_marker_name, j.expected_marker, j.expected_delivery_mode,
       d.remote_dir, k.file_name
FROM export_jobs j
JOIN deliveries k ON k.tenant_id = j.tenant_id AND k.delivery_key = j.delivery_key
LEFT JOIN destinations d ON d.id = j.destination_id
WHERE %(job_id)s::uuid IS NULL OR j.id = %(job_id)s::uuid
ORDER BY j.created_at, j.id;

-- name: chaos_remote_dirs
-- Every destination's directory at the partner: a key's final file may be in any of them.
SELECT DISTINCT remote_dir FROM destinations ORDER BY remote_dir;

-- name: chaos_events
-- Every job's events in the order they were inserted: a job's transitions serialize on its row lock,
-- so within one job the identity order is the order they happened.
SELECT id, job_id, attempt_id, kind, version, worker_id, observed_by, detail, recorded_at
FROM export_attempt_events
ORDER BY job_id, id;

-- name: chaos_outbox
-- ahead: the row is unpublished and not due yet (the relay publishes a row once
-- coalesce(due_at, created_at) has passed), judged on the database's clock.
SELECT message_id, kind, job_id, created_at, due_at, published_at,
       published_at IS NULL AND coalesce(due_at, created_at) > clock_timestamp() AS ahead
FROM outbox
ORDER BY job_id, coalesce(due_at, created_at), message_id;

-- name: chaos_cancellations
SELECT tenant_id, id, job_id, requested_by, reason, outcome, found_status, found_attempt_id,
       found_attempt_count, found_delivery_authorized_at, recorded_at
FROM cancellation_requests
ORDER BY job_id, recorded_at, id;

-- name: chaos_webhook_deliveries
-- Every webhook delivery, each job's in the order its outcomes committed.
SELECT id, endpoint_id, tenant_id, job_id, attempt_id, status, failure_reason, source, occurred_at, state, attempts
FROM webhook_deliveries
ORDER BY job_id, occurred_at, id;

-- name: chaos_notified_tenants
-- The tenants with a live webhook endpoint: each outcome of their jobs must have told it.
SELECT DISTINCT tenant_id FROM webhook_endpoints WHERE removed_at IS NULL;

-- name: chaos_pending_webhooks
-- Webhook deliveries still owed to a receiver: the system has not settled while there are any.
SELECT count(*)::int AS n FROM webhook_deliveries WHERE state = 'pending';

-- name: chaos_job_events
SELECT id, job_id, attempt_id, kind, version, worker_id, observed_by, detail, recorded_at
FROM export_attempt_events
WHERE job_id = %(job_id)s
ORDER BY id;

-- name: chaos_job_outbox
SELECT message_id, kind, job_id, created_at, due_at, published_at,
       published_at IS NULL AND coalesce(due_at, created_at) > clock_timestamp() AS ahead
FROM outbox
WHERE job_id = %(job_id)s
ORDER BY coalesce(due_at, created_at), message_id;

-- name: chaos_job_cancellations
SELECT tenant_id, id, job_id, requested_by, reason, outcome, found_status, found_attempt_id,
       found_attempt_count, found_delivery_authorized_at, recorded_at
FROM cancellation_requests
WHERE job_id = %(job_id)s
ORDER BY recorded_at, id;

-- name: chaos_overdue_leases
-- Attempts whose lease ran out more than the grace ago: recovery should have taken them over by now.
SELECT id, status, attempt_id, claimed_by, lease_expires_at,
       extract(epoch FROM clock_timestamp() - lease_expires_at)::float8 AS overdue_seconds
FROM export_jobs
WHERE status IN ('Running', 'Delivering')
  AND lease_expires_at < (SELECT clock_timestamp() - make_interval(secs => %(grace_seconds)s))
ORDER BY lease_expires_at;

-- name: chaos_stale_queued
-- Queued jobs whose newest wake-up is older than the bound: its time is the row's due time, or its
-- insert time when due at once, as the relay and the sweeper count it; a job whose rows retention
-- archived counts from woken_at.
SELECT id, woken_at, sweep_count, deferrals, last_wake_up,
       extract(epoch FROM clock_timestamp() - last_wake_up)::float8 AS age_seconds
FROM (
    SELECT j.id, j.woken_at, j.sweep_count, j.deferrals,
           coalesce((SELECT max(coalesce(o.due_at, o.created_at)) FROM outbox o WHERE o.job_id = j.id),
                    j.woken_at) AS last_wake_up
    FROM export_jobs j
    WHERE j.status = 'Queued'
) AS queued
WHERE last_wake_up < (SELECT clock_timestamp() - make_interval(secs => %(older_than_seconds)s))
ORDER BY last_wake_up;

-- name: chaos_counts_by_status
SELECT status, count(*)::int AS n
FROM export_jobs
GROUP BY status
ORDER BY status;

-- name: chaos_status_of
SELECT id, status
FROM export_jobs
WHERE id = ANY(%(job_ids)s::uuid[]);

-- name: chaos_unpublished_outbox
-- Outbox rows the relay has not published; with due_only, those already due (a deferral's wake-up due
-- later is not counted).
SELECT count(*)::int AS n
FROM outbox
WHERE published_at IS NULL
  AND (NOT %(due_only)s OR coalesce(due_at, created_at) <= clock_timestamp());

-- name: chaos_final_states
-- Jobs by status, a Failed one by its code too ("Failed/NotDelivered").
SELECT CASE WHEN status = 'Failed' THEN status || '/' || failure_reason ELSE status END AS state,
       count(*)::int AS n
FROM export_jobs
GROUP BY 1
ORDER BY 1;

-- name: chaos_schedules
-- Every schedule, for the checker's one-export-per-slot rule.
SELECT id, cron, time_zone, state, incremental FROM schedules ORDER BY created_at;

-- name: chaos_schedule_runs
-- Every decided slot, each schedule's in order.
SELECT schedule_id, slot, fire_at, trigger, outcome, job_id FROM schedule_runs ORDER BY schedule_id, slot;

-- name: chaos_scheduled_jobs
-- Every export a schedule made (replacements carry their original's slot).
SELECT id, schedule_id, schedule_slot, replaces_job_id, status FROM export_jobs
WHERE schedule_id IS NOT NULL ORDER BY created_at;
