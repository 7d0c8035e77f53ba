-- The relay's side of the outbox, run as exports_dispatcher: it may read rows and set published_at.

-- name: relay_claim_batch
-- The rows that are due (a deferral's wake-up is due only after its backoff), oldest due first. SKIP
-- LOCKED lets several relays drain the outbox at once without publishing a row twice per pass. The
-- bound is read once (a scalar subquery), so it is an index condition on ix_outbox_unpublished. The
-- job's tenant is read for the relay's log line only (the one column of export_jobs it may read beside
-- the id), and no job row is locked. In the same statement, so the relay's wait costs no transaction of
-- its own: the seconds until the next unpublished row outside this batch falls due (NULL when none
-- waits; 0 or less when one is due now, held by another relay or left beyond the batch). Always one row
-- at least: an empty batch is one row of NULLs but that.
WITH batch AS (
    SELECT message_id, kind, job_id, created_at, due_at
    FROM outbox
    WHERE published_at IS NULL AND coalesce(due_at, created_at) <= (SELECT clock_timestamp())
    ORDER BY coalesce(due_at, created_at)
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED),
later AS (
    SELECT extract(epoch FROM min(coalesce(due_at, created_at)) - clock_timestamp()) AS seconds
    FROM outbox
    WHERE published_at IS NULL AND message_id NOT IN (SELECT message_id FROM batch))
SELECT b.message_id, b.kind, b.job_id, b.created_at, b.due_at, j.tenant_id, later.seconds AS next_due_seconds
FROM later
LEFT JOIN batch b ON true
LEFT JOIN export_jobs j ON j.id = b.job_id
ORDER BY coalesce(b.due_at, b.created_at);

-- name: relay_mark_published
UPDATE outbox
SET published_at = clock_timestamp()
WHERE message_id = ANY(%(message_ids)s) AND published_at IS NULL
RETURNING message_id;
