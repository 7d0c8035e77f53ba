-- What the worker reads around its writes. The message is a hint: every decision starts from these.

-- name: worker_read_job
-- The job as the runner needs it, re-read from the row rather than taken from the message: with how
-- often and since how long (on the database's clock) it has been deferred, for the next backoff and
-- the deferral budget.
SELECT id, tenant_id, status, version, destination_id, delivery_key, replaces_job_id, overwrite_agreement_ref,
       deferrals, extract(epoch FROM clock_timestamp() - deferred_since) AS deferred_for_seconds, last_deferral
FROM export_jobs WHERE id = %(job_id)s;

-- name: worker_read_original_expected
-- A replacement's original as cutoff 2 recorded it: what a file under the shared final name must
-- match to be identified as the original's delivery.
SELECT expected_file_name, expected_file_bytes, expected_file_sha256
FROM export_jobs WHERE tenant_id = %(tenant_id)s AND id = %(original_job_id)s;

-- name: worker_confirm_stops
-- Which of the watched attempts have a recorded stop request, confirmed on the row itself.
SELECT j.id
FROM export_jobs j
JOIN unnest(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[]) AS w (job_id, attempt_id)
  ON j.id = w.job_id AND j.attempt_id = w.attempt_id
WHERE j.status = 'Running' AND j.stop_request_id IS NOT NULL;

-- name: worker_copy_consenting_contacts
-- PostgreSQL writes the CSV itself. COPY takes no server-side parameters, so psycopg binds the
-- tenant id client-side as a quoted literal.
COPY (SELECT email, full_name, company, phone FROM contacts
      WHERE tenant_id = %(tenant_id)s AND consent ORDER BY id)
TO STDOUT WITH (FORMAT csv, HEADER true, ENCODING 'UTF8');
