-- What the scheduler exports as gauges on each scrape: reads only, each bounded by an index.

-- name: metrics_jobs_by_status
SELECT status, count(*) AS jobs FROM export_jobs GROUP BY status;

-- name: metrics_backlog
-- The numbers an operator acts on: the relay's lag, the oldest wait in Queued, leases nobody took over,
-- OutcomeUnknown jobs waiting for a person, the most republished job (the reference: alert when a
-- job's sweep_count keeps rising), the destinations whose circuit is open, and the exports held by a pause
-- (apart from the oldest wait: they wait for a person's resume, not for a worker). The relay's lag counts from when a row fell due: a deferral's wake-up
-- waiting for its backoff is scheduled, not late, and is counted apart.
SELECT
    (SELECT count(*) FROM outbox WHERE published_at IS NULL
     AND coalesce(due_at, created_at) <= (SELECT clock_timestamp())) AS unpublished,
    (SELECT extract(epoch FROM clock_timestamp() - min(coalesce(due_at, created_at))) FROM outbox
     WHERE published_at IS NULL AND coalesce(due_at, created_at) <= (SELECT clock_timestamp()))
        AS oldest_unpublished_seconds,
    (SELECT count(*) FROM outbox WHERE published_at IS NULL
     AND coalesce(due_at, created_at) > (SELECT clock_timestamp())) AS scheduled,
    (SELECT count(*) FROM export_jobs WHERE status = 'Queued' AND deferrals > 0
     AND woken_at > (SELECT clock_timestamp())) AS deferred_jobs,
    -- ORDER BY ... LIMIT 1 rather than min(): with the pause checks min() would read every Queued row, this
    -- reads ix_export_jobs_woken from its oldest entry until one is not held.
    (SELECT extract(epoch FROM clock_timestamp() - j.woken_at) FROM export_jobs j WHERE status = 'Queued'
     AND NOT EXISTS (SELECT 1 FROM destinations d WHERE d.id = j.destination_id AND d.pause_state IS NOT NULL)
     AND NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = j.tenant_id AND t.paused_at IS NOT NULL)
     ORDER BY j.woken_at LIMIT 1) AS oldest_queued_seconds,
    (SELECT count(*) FROM export_jobs
     WHERE status IN ('Running', 'Delivering') AND lease_expires_at < (SELECT clock_timestamp())) AS expired_leases,
    (SELECT extract(epoch FROM clock_timestamp() - min(lease_expires_at)) FROM export_jobs
     WHERE status IN ('Running', 'Delivering') AND lease_expires_at < (SELECT clock_timestamp()))
        AS oldest_expired_lease_seconds,
    (SELECT count(*) FROM export_jobs WHERE status = 'OutcomeUnknown') AS outcome_unknown,
    (SELECT coalesce(max(sweep_count), 0) FROM export_jobs WHERE status = 'Queued') AS max_sweeps,
    (SELECT count(*) FROM export_jobs j WHERE status = 'Queued'
     AND (EXISTS (SELECT 1 FROM destinations d WHERE d.id = j.destination_id AND d.pause_state IS NOT NULL)
          OR EXISTS (SELECT 1 FROM tenants t WHERE t.id = j.tenant_id AND t.paused_at IS NOT NULL))) AS held_jobs,
    (SELECT count(*) FROM destination_circuits WHERE state = 'open') AS open_circuits;

-- name: metrics_failed_by_code
-- Failed jobs by failure code: an alert on its growth sees every failed delivery, before cutoff 2 (a
-- refused host key or credential) or after it, and recovery's AttemptsExhausted.
SELECT failure_reason AS code, count(*) AS jobs FROM export_jobs WHERE status = 'Failed' GROUP BY failure_reason;

-- name: metrics_live_processes
SELECT role, count(*) AS processes
FROM process_heartbeats
WHERE stopped_at IS NULL AND beat_at > (SELECT clock_timestamp() - make_interval(secs => %(silent_seconds)s))
GROUP BY role;

-- name: metrics_schedules
-- Active schedules, how long the most overdue one's fire has waited for a scheduler (0 when none: every
-- scheduler down shows here), and slots of incremental schedules held for a run that is not settled.
SELECT
    (SELECT count(*) FROM schedules WHERE state = 'Active') AS active,
    (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(next_fire_at)), 0) FROM schedules
     WHERE state = 'Active' AND next_fire_at <= (SELECT clock_timestamp())) AS overdue_seconds,
    (SELECT count(*) FROM schedule_runs WHERE outcome = 'Held') AS held_slots;

-- name: metrics_webhooks
-- The notifier's backlog: events owed to receivers (and how long since the oldest one's outcome),
-- endpoints owed an event for longer than the threshold (a receiver down, or no notifier running), and
-- deliveries given up (dead), in all and in the last day. Partial indexes bound each count.
SELECT
    (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending') AS pending,
    (SELECT extract(epoch FROM clock_timestamp() - min(occurred_at)) FROM webhook_deliveries
     WHERE state = 'pending') AS oldest_pending_seconds,
    (SELECT count(DISTINCT endpoint_id) FROM webhook_deliveries
     WHERE state = 'pending' AND occurred_at < (SELECT clock_timestamp() - make_interval(secs => %(late_seconds)s)))
        AS late_endpoints,
    (SELECT count(*) FROM webhook_deliveries WHERE state = 'dead') AS dead,
    (SELECT count(*) FROM webhook_deliveries
     WHERE state = 'dead' AND finished_at > (SELECT clock_timestamp() - interval '1 day')) AS dead_last_day;

-- name: metrics_late_webhooks
-- The endpoints owed an event for longer than the threshold, the longest-owed first: tenant and name.
SELECT t.name AS tenant, e.name AS webhook, extract(epoch FROM clock_timestamp() - late.oldest) AS seconds
FROM (SELECT endpoint_id, min(occurred_at) AS oldest FROM webhook_deliveries
      WHERE state = 'pending' AND occurred_at < (SELECT clock_timestamp() - make_interval(secs => %(late_seconds)s))
      GROUP BY endpoint_id) AS late
JOIN webhook_endpoints e ON e.id = late.endpoint_id
JOIN tenants t ON t.id = e.tenant_id
ORDER BY late.oldest
LIMIT %(limit)s;
