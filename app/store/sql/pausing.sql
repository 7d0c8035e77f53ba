-- Pauses: a destination paused or draining, a tenant paused. A paused one's queued exports wait unclaimed
-- (the worker reads the pause with the job, worker_read_job, and does not claim; the sweeper leaves them),
-- and the resume wakes them in its own statement: every queued export of a destination and tenant that are
-- not paused has a live wake-up, as before. Each change records its directory_events row in the same
-- statement; a change that matches nothing records nothing.

-- name: pausing_pause_destination
-- Active or draining -> paused, at once: no new attempt starts; attempts already running are not stopped
-- (past cutoff 2 nothing may stop them, and before it a stop would only end what a resume would rebuild).
WITH paused AS (
    UPDATE destinations
    SET pause_state = 'paused', paused_by = %(changed_by)s, paused_reason = %(reason)s,
        paused_at = clock_timestamp()
    WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s AND pause_state IS DISTINCT FROM 'paused'
    RETURNING tenant_id, id, paused_at)
INSERT INTO directory_events (tenant_id, destination_id, kind, changed_by, reason)
SELECT tenant_id, id, 'Paused', %(changed_by)s, %(reason)s FROM paused
RETURNING recorded_at;

-- name: pausing_drain_destination
-- Active -> draining: no new attempt starts, those running finish, then pausing_settle_drains pauses it.
-- A destination already paused or draining matches nothing.
WITH draining AS (
    UPDATE destinations
    SET pause_state = 'draining', paused_by = %(changed_by)s, paused_reason = %(reason)s,
        paused_at = clock_timestamp()
    WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s AND pause_state IS NULL
    RETURNING tenant_id, id)
INSERT INTO directory_events (tenant_id, destination_id, kind, changed_by, reason)
SELECT tenant_id, id, 'Draining', %(changed_by)s, %(reason)s FROM draining
RETURNING recorded_at;

-- name: pausing_settle_drains
-- Draining -> paused once none of its attempts is Running or Delivering (one destination, or every one
-- when none is named: the sweeper's pass). Its event names whoever started the drain.
WITH drained AS (
    UPDATE destinations d SET pause_state = 'paused'
    WHERE d.pause_state = 'draining'
      AND (%(destination_id)s::uuid IS NULL OR (d.tenant_id = %(tenant_id)s::uuid AND d.id = %(destination_id)s::uuid))
      AND NOT EXISTS (SELECT 1 FROM export_jobs j
                      WHERE j.tenant_id = d.tenant_id AND j.status IN ('Running', 'Delivering')
                        AND j.destination_id = d.id)
    RETURNING d.tenant_id, d.id, d.paused_by, d.paused_reason)
INSERT INTO directory_events (tenant_id, destination_id, kind, changed_by, reason)
SELECT tenant_id, id, 'Drained', paused_by, paused_reason FROM drained
RETURNING destination_id;

-- name: pausing_resume_destination
-- Paused or draining -> active, and in the same statement a fresh wake-up for each of its queued exports
-- whose tenant is not paused (woken_at now, an outbox row each): they waited with no live message. The
-- UPDATE re-checks Queued on each row it waits for, so an export claimed or canceled meanwhile gets none.
WITH resumed AS (
    UPDATE destinations
    SET pause_state = NULL, paused_by = NULL, paused_reason = NULL, paused_at = NULL
    WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s AND pause_state IS NOT NULL
    RETURNING tenant_id, id),
event AS (
    INSERT INTO directory_events (tenant_id, destination_id, kind, changed_by, reason)
    SELECT tenant_id, id, 'Resumed', %(changed_by)s, %(reason)s FROM resumed),
woken AS (
    UPDATE export_jobs j SET woken_at = clock_timestamp()
    FROM resumed r
    WHERE j.tenant_id = r.tenant_id AND j.status = 'Queued' AND j.destination_id = r.id
      AND NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = j.tenant_id AND t.paused_at IS NOT NULL)
    RETURNING j.id),
wake AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM woken)
SELECT (SELECT count(*) FROM resumed) AS resumed, (SELECT count(*) FROM woken) AS woken;

-- name: pausing_pause_tenant
-- Active -> paused: none of the tenant's exports starts a new attempt; creating one still queues it.
WITH paused AS (
    UPDATE tenants SET paused_by = %(changed_by)s, paused_reason = %(reason)s, paused_at = clock_timestamp()
    WHERE id = %(tenant_id)s AND paused_at IS NULL
    RETURNING id)
INSERT INTO directory_events (tenant_id, kind, changed_by, reason)
SELECT id, 'Paused', %(changed_by)s, %(reason)s FROM paused
RETURNING recorded_at;

-- name: pausing_resume_tenant
-- Paused -> active, with a fresh wake-up for each of the tenant's queued exports whose destination is not
-- paused or draining (as pausing_resume_destination does for a destination's).
WITH resumed AS (
    UPDATE tenants SET paused_by = NULL, paused_reason = NULL, paused_at = NULL
    WHERE id = %(tenant_id)s AND paused_at IS NOT NULL
    RETURNING id),
event AS (
    INSERT INTO directory_events (tenant_id, kind, changed_by, reason)
    SELECT id, 'Resumed', %(changed_by)s, %(reason)s FROM resumed),
woken AS (
    UPDATE export_jobs j SET woken_at = clock_timestamp()
    FROM resumed r
    WHERE j.tenant_id = r.id AND j.status = 'Queued'
      AND NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = j.destination_id AND d.pause_state IS NOT NULL)
    RETURNING j.id),
wake AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM woken)
SELECT (SELECT count(*) FROM resumed) AS resumed, (SELECT count(*) FROM woken) AS woken;

-- name: pausing_list_tenants
-- Every tenant (or the one named) with its pause, its destinations (and how many are paused or draining) and its exports
-- waiting in Queued or running now (ix_export_jobs_tenant_status).
SELECT t.id, t.name, t.created_at, t.paused_by, t.paused_reason, t.paused_at,
       (SELECT count(*) FROM destinations d WHERE d.tenant_id = t.id) AS destinations,
       (SELECT count(*) FROM destinations d WHERE d.tenant_id = t.id AND d.pause_state IS NOT NULL)
           AS paused_destinations,
       (SELECT count(*) FROM export_jobs j WHERE j.tenant_id = t.id AND j.status = 'Queued') AS queued,
       (SELECT count(*) FROM export_jobs j WHERE j.tenant_id = t.id AND j.status IN ('Running', 'Delivering'))
           AS running
FROM tenants t
WHERE %(tenant_id)s::uuid IS NULL OR t.id = %(tenant_id)s::uuid
ORDER BY t.name, t.id;

-- name: pausing_read_destination
-- A destination's pause as `destination show` and the pause verbs report it, with its attempts running
-- now and its exports waiting in Queued; only if it belongs to the tenant.
SELECT d.pause_state, d.paused_by, d.paused_reason, d.paused_at, t.paused_at AS tenant_paused_at,
       t.paused_by AS tenant_paused_by,
       (SELECT count(*) FROM export_jobs j WHERE j.tenant_id = d.tenant_id AND j.status IN ('Running', 'Delivering')
          AND j.destination_id = d.id) AS running,
       (SELECT count(*) FROM export_jobs j WHERE j.tenant_id = d.tenant_id AND j.status = 'Queued'
          AND j.destination_id = d.id) AS queued
FROM destinations d JOIN tenants t ON t.id = d.tenant_id
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s;
