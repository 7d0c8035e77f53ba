-- The relay's side of the outbox, run as exports_dispatcher: it may read rows and set published_at.

-- name: relay_claim_batch
-- The rows that are due (a deferral's wake-up is due only after its backoff), oldest due first. SKIP
-- LOCKED lets several relays drain the outbox at once without publishing a row twice per pass. The
-- bound is read once (a scalar subquery), so it is an index condition on ix_outbox_unpublished. The
-- job's tenant is read for the relay's log line only (the one column of export_jobs it may read beside
-- the id), and no job row is locked.
SELECT o.message_id, o.kind, o.job_id, o.created_at, o.due_at, j.tenant_id
FROM outbox o
LEFT JOIN export_jobs j ON j.id = o.job_id
WHERE o.published_at IS NULL AND coalesce(o.due_at, o.created_at) <= (SELECT clock_timestamp())
ORDER BY coalesce(o.due_at, o.created_at)
LIMIT %(batch_size)s
FOR UPDATE OF o SKIP LOCKED;

-- name: relay_next_due
-- Seconds until the next unpublished row falls due (NULL when none waits), so the relay sleeps no longer.
SELECT extract(epoch FROM min(coalesce(due_at, created_at)) - clock_timestamp()) AS seconds
FROM outbox
WHERE published_at IS NULL;

-- name: relay_mark_published
UPDATE outbox
SET published_at = clock_timestamp()
WHERE message_id = ANY(%(message_ids)s) AND published_at IS NULL
RETURNING message_id;
