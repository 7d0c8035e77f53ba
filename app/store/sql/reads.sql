-- Reads that belong to the protocol: each asks the row exactly what a write checked, on the database's
-- clock, so a lost response is settled by the row and never by an exception.

-- name: export_read_ownership
-- State and ownership read together, with the replacement's original, for the lost-response wrappers.
SELECT j.status, j.attempt_id, j.stop_request_id,
       coalesce(j.lease_expires_at > clock_timestamp(), false) AS lease_current,
       o.status AS original_status
FROM export_jobs j
LEFT JOIN export_jobs o ON o.tenant_id = j.tenant_id AND o.id = j.replaces_job_id
WHERE j.id = %(job_id)s;

-- name: recovery_scan_expired
-- Nominates only: every takeover repeats these conditions in its own write.
SELECT id, tenant_id, attempt_id, status, stop_request_id, attempt_count, replaces_job_id,
       expected_file_name, expected_file_bytes, expected_file_sha256, destination_id
FROM export_jobs
WHERE status IN ('Running', 'Delivering') AND lease_expires_at < clock_timestamp()
ORDER BY lease_expires_at
LIMIT %(batch_size)s;
