-- The scavenger ties local files to attempts: it reads, and never writes a row.

-- name: scavenger_read_attempts
-- The current attempt and state of the jobs that local files name; a file whose job is missing is an orphan.
SELECT id, status, attempt_id
FROM export_jobs
WHERE id = ANY(%(job_ids)s::uuid[]);
