-- The relay's side of the outbox, run as exports_dispatcher: it may read rows and set published_at.

-- name: relay_claim_batch
-- SKIP LOCKED lets several relays drain the outbox at once without publishing a row twice per pass.
SELECT message_id, kind, job_id, created_at
FROM outbox
WHERE published_at IS NULL
ORDER BY created_at
LIMIT %(batch_size)s
FOR UPDATE SKIP LOCKED;

-- name: relay_mark_published
UPDATE outbox
SET published_at = clock_timestamp()
WHERE message_id = ANY(%(message_ids)s) AND published_at IS NULL
RETURNING message_id;
