-- The sweeper: a fresh wake-up for every job left Queued longer than the threshold.

-- name: sweeper_republish_due
-- Batched, so a large backlog never becomes one long transaction. SKIP LOCKED leaves rows another writer
-- is changing to the next sweep; the UPDATE re-checks Queued, so a job that left the queue gets nothing.
-- The threshold is computed once (a scalar subquery), so it bounds the scan of ix_export_jobs_woken
-- instead of being re-evaluated on every Queued row. A job whose tenant or destination is paused (or
-- draining) waits unclaimed by design, with no message: the resume wakes it (sql/pausing.sql), so it is left.
WITH due AS (
    SELECT id FROM export_jobs j
    WHERE status = 'Queued' AND woken_at < (SELECT clock_timestamp() - make_interval(secs => %(sweep_after_seconds)s))
      AND NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = j.destination_id AND d.pause_state IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = j.tenant_id AND t.paused_at IS NOT NULL)
    ORDER BY woken_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED),
swept AS (
    UPDATE export_jobs j
    SET woken_at = clock_timestamp(), sweep_count = j.sweep_count + 1
    FROM due
    WHERE j.id = due.id AND j.status = 'Queued'
    RETURNING j.id, j.tenant_id),
woken AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM swept
    RETURNING job_id, message_id)
-- The job's tenant and its new wake-up, for the sweeper's line about each.
SELECT woken.job_id, woken.message_id, swept.tenant_id FROM woken JOIN swept ON swept.id = woken.job_id;
