-- Schedules and their slots. Every write is conditional on the state or fire time it read; the primary key
-- of schedule_runs (schedule, slot) is what makes a slot run at most once, and a slot's export is created
-- in the transaction that records the slot. Each transaction that may create an export for a schedule
-- first locks the schedule's row (schedule_advance, schedule_lock), so one schedule's creations take turns.

-- name: schedule_add
-- A new schedule, active from its first fire time (computed by APScheduler from --starting), only for a
-- destination of the same tenant (fk_schedules_destination).
INSERT INTO schedules (id, tenant_id, destination_id, cron, time_zone, incremental, state, next_fire_at,
                       created_by, changed_by)
VALUES (%(schedule_id)s, %(tenant_id)s, %(destination_id)s, %(cron)s, %(time_zone)s, %(incremental)s, 'Active',
        %(next_fire_at)s, %(changed_by)s, %(changed_by)s)
RETURNING id;

-- name: schedule_pause
-- Active -> Paused: no slot fires while paused. Exports it already created go on untouched.
UPDATE schedules SET state = 'Paused', next_fire_at = NULL, changed_by = %(changed_by)s, changed_at = clock_timestamp()
WHERE tenant_id = %(tenant_id)s AND id = %(schedule_id)s AND state = 'Active'
RETURNING id;

-- name: schedule_resume
-- Paused -> Active from the first fire time after now: the slots of the pause are not caught up.
UPDATE schedules SET state = 'Active', next_fire_at = %(next_fire_at)s, changed_by = %(changed_by)s,
                     changed_at = clock_timestamp()
WHERE tenant_id = %(tenant_id)s AND id = %(schedule_id)s AND state = 'Paused'
RETURNING id;

-- name: schedule_remove
-- Active or Paused -> Removed, for good. The row stays: its runs and exports name it.
UPDATE schedules SET state = 'Removed', next_fire_at = NULL, changed_by = %(changed_by)s,
                     changed_at = clock_timestamp()
WHERE tenant_id = %(tenant_id)s AND id = %(schedule_id)s AND state IN ('Active', 'Paused')
RETURNING id;

-- name: schedule_read_due
-- Active schedules whose next fire time has come, on the database's clock, which every scheduler shares
-- (or as of a given instant: tests replay fixed instants).
SELECT id, tenant_id, destination_id, cron, time_zone, incremental, next_fire_at, now
FROM schedules, coalesce(%(as_of)s::timestamptz, clock_timestamp()) AS now
WHERE state = 'Active' AND next_fire_at <= now
ORDER BY next_fire_at
LIMIT %(limit)s;

-- name: schedule_advance
-- Moves the schedule past the slots this transaction decides, only over the fire time it read: of two
-- schedulers that read the same one, the second waits for the first's row lock, then matches nothing.
UPDATE schedules SET next_fire_at = %(next_fire_at)s
WHERE id = %(schedule_id)s AND state = 'Active' AND next_fire_at = %(seen)s
RETURNING id;

-- name: schedule_lock
-- The schedule's row, locked for a release of a held slot or a run-now; nothing once it is removed.
SELECT id, tenant_id, destination_id, cron, time_zone, incremental, state, clock_timestamp() AS now
FROM schedules
WHERE id = %(schedule_id)s AND tenant_id = %(tenant_id)s AND state IN ('Active', 'Paused')
FOR NO KEY UPDATE;

-- name: schedule_read_hold
-- For an incremental schedule: the export that holds its next run (of a delivery key with a live or
-- OutcomeUnknown export and no Completed one: its changes may not have reached the partner, and may yet),
-- a slot already held, and the watermark: the snapshot the last Completed run built from, the newest by
-- cutoff 2 (runs take turns, so that is the last run to complete).
SELECT (SELECT j.id FROM export_jobs j
        WHERE j.schedule_id = %(schedule_id)s AND j.status IN ('Queued', 'Running', 'Delivering', 'OutcomeUnknown')
          AND NOT EXISTS (SELECT 1 FROM export_jobs c WHERE c.tenant_id = j.tenant_id
                          AND c.delivery_key = j.delivery_key AND c.status = 'Completed')
        ORDER BY j.created_at LIMIT 1) AS holding_job_id,
       (SELECT r.slot FROM schedule_runs r WHERE r.schedule_id = %(schedule_id)s AND r.outcome = 'Held'
        ORDER BY r.slot LIMIT 1) AS held_slot,
       (SELECT j.expected_snapshot::text FROM export_jobs j
        WHERE j.schedule_id = %(schedule_id)s AND j.status = 'Completed' AND j.expected_snapshot IS NOT NULL
        ORDER BY j.delivery_authorized_at DESC LIMIT 1) AS watermark;

-- name: schedule_record_runs
-- The slots this transaction decided, each once: a slot already recorded (a second 02:00 when clocks go
-- back, or a slot another scheduler decided) is skipped, and only the slots returned are this
-- transaction's to act on.
INSERT INTO schedule_runs (schedule_id, slot, fire_at, trigger, outcome, job_id, detail)
SELECT %(schedule_id)s, slot, fire_at, %(trigger)s, outcome, job_id, detail
FROM unnest(%(slots)s::timestamp[], %(fire_ats)s::timestamptz[], %(outcomes)s::text[], %(job_ids)s::uuid[],
            %(details)s::text[]) AS decided (slot, fire_at, outcome, job_id, detail)
ON CONFLICT ON CONSTRAINT pk_schedule_runs DO NOTHING
RETURNING slot, outcome, job_id;

-- name: schedule_read_held
-- Held slots of active schedules, oldest first: each is released once the run holding it is settled.
SELECT r.schedule_id, r.slot, s.tenant_id
FROM schedule_runs r
JOIN schedules s ON s.id = r.schedule_id
WHERE r.outcome = 'Held' AND s.state = 'Active'
ORDER BY r.recorded_at
LIMIT %(limit)s;

-- name: schedule_release_held
-- Held -> Created with the export the same transaction creates; of two schedulers, one matches.
UPDATE schedule_runs SET outcome = 'Created', job_id = %(job_id)s, decided_at = clock_timestamp(),
                         detail = %(detail)s
WHERE schedule_id = %(schedule_id)s AND slot = %(slot)s AND outcome = 'Held'
RETURNING slot;
