-- Outbox retention, run as exports_retention: a published row older than the retention period is
-- deleted in the same transaction that hands it to the archive; an unpublished row is never selected
-- here, and the outbox trigger refuses its deletion anyway.

-- name: retention_delete_published
-- One batch, oldest first. The caller writes the returned rows to the archive and makes them durable
-- before it commits, so a row is deleted only once it is archived (a crash in between leaves it in the
-- outbox, to be archived again: the archive is keyed by message_id). No FOR UPDATE: it would need an
-- UPDATE grant, and the relay never touches a published row, while a second retention run waits for
-- the first's DELETE and then finds the row gone.
DELETE FROM outbox
WHERE message_id IN (
    SELECT message_id FROM outbox
    WHERE created_at < (SELECT clock_timestamp() - make_interval(secs => %(older_than_seconds)s))
      AND published_at IS NOT NULL
      AND published_at < (SELECT clock_timestamp() - make_interval(secs => %(older_than_seconds)s))
    ORDER BY created_at
    LIMIT %(batch_size)s)
  AND published_at IS NOT NULL
RETURNING message_id, kind, job_id, created_at, published_at;
