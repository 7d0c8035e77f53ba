-- Whether a partner can be reached, shared by every worker host: each destination's circuit, and the
-- session slots that keep the sessions open to it within its max_sessions. None of these statements
-- touches a job; they decide only whether an attempt tries the partner now or defers.

-- name: partner_read_circuit
-- The destination's circuit as an attempt decides on it, with the database's clock: how long until the
-- next probe (0 or less: it is due), and does another attempt hold the probe. No row: closed.
SELECT state, failures, last_error,
       extract(epoch FROM next_probe_at - clock_timestamp()) AS probe_in_seconds,
       coalesce(probe_attempt_id IS NOT NULL AND probe_until > clock_timestamp(), false) AS probe_held
FROM destination_circuits
WHERE destination_id = %(destination_id)s;

-- name: partner_claim_probe
-- One attempt probes an open circuit once its probe is due: conditional, so of the attempts that found
-- it due one wins, and a probe whose attempt vanished is claimable again after probe_until.
UPDATE destination_circuits
SET probe_attempt_id = %(attempt_id)s,
    probe_until = clock_timestamp() + make_interval(secs => %(probe_seconds)s),
    updated_at = clock_timestamp()
WHERE destination_id = %(destination_id)s AND state = 'open' AND next_probe_at <= clock_timestamp()
  AND (probe_attempt_id IS NULL OR probe_until <= clock_timestamp())
RETURNING destination_id;

-- name: partner_record_failure
-- A connection to the partner failed. A closed circuit opens, and a failed probe reopens it, each with
-- the next probe a backoff away (base * 2^failures, capped); a failure of an attempt that started
-- before the circuit opened only records its error, so a burst of them does not push the probe away.
-- opened answers whether this failure opened a closed circuit.
WITH now AS (SELECT clock_timestamp() AS t)
INSERT INTO destination_circuits AS c (destination_id, state, opened_at, next_probe_at, failures, last_error,
                                       updated_at)
SELECT %(destination_id)s, 'open', now.t, now.t + make_interval(secs => least(%(max_seconds)s, %(base_seconds)s)),
       1, %(error)s, now.t
FROM now
ON CONFLICT (destination_id) DO UPDATE
SET state = 'open',
    opened_at = CASE WHEN c.state = 'closed' THEN EXCLUDED.opened_at ELSE c.opened_at END,
    failures = CASE WHEN c.state = 'closed' OR c.probe_attempt_id = %(attempt_id)s THEN c.failures + 1
                    ELSE c.failures END,
    next_probe_at = CASE
        WHEN c.state = 'closed' OR c.probe_attempt_id = %(attempt_id)s
        THEN EXCLUDED.updated_at + make_interval(secs => least(%(max_seconds)s,
                                                               %(base_seconds)s * power(2, least(c.failures, 30))))
        ELSE c.next_probe_at END,
    probe_attempt_id = CASE WHEN c.probe_attempt_id = %(attempt_id)s THEN NULL ELSE c.probe_attempt_id END,
    probe_until = CASE WHEN c.probe_attempt_id = %(attempt_id)s THEN NULL ELSE c.probe_until END,
    last_error = EXCLUDED.last_error,
    updated_at = EXCLUDED.updated_at
RETURNING opened_at = updated_at AS opened, failures, next_probe_at;

-- name: partner_close_circuit
-- A connection succeeded: the circuit closes, its count of failures starts again. The last error stays,
-- for the operator.
UPDATE destination_circuits
SET state = 'closed', next_probe_at = NULL, probe_attempt_id = NULL, probe_until = NULL, failures = 0,
    updated_at = clock_timestamp()
WHERE destination_id = %(destination_id)s AND state = 'open'
RETURNING destination_id;

-- Session slots: session-level advisory locks keyed by the destination (high 32 bits: its hash) and a
-- slot number (low 32 bits), taken without waiting by the connection that then holds them for as long
-- as the SSH session is open. A worker that dies releases its slots with its database session.

-- name: partner_try_slot
SELECT pg_try_advisory_lock((hashtext(%(destination_id)s::text)::bigint << 32) | %(slot)s) AS taken;

-- name: partner_release_slot
SELECT pg_advisory_unlock((hashtext(%(destination_id)s::text)::bigint << 32) | %(slot)s) AS released;

-- name: partner_status
-- Each destination as `exports destination status` shows it: its circuit, the session slots held now
-- (advisory locks in this database with the destination's hash as their high half), and how many of its
-- jobs wait out a deferral; its pause (and its tenant's) with who and why, and how many queued exports
-- the pause holds; and the newest failed export's cause, with when it was recorded, so a credential the
-- partner refused shows here as well as a connection that failed.
SELECT d.id, t.name AS tenant_name, d.name, d.host, d.port, d.active, d.max_sessions, d.auto_retries,
       d.pause_state, d.paused_by, d.paused_reason, d.paused_at, t.paused_at AS tenant_paused_at,
       t.paused_by AS tenant_paused_by,
       (SELECT count(*) FROM export_jobs j
        WHERE j.tenant_id = d.tenant_id AND j.status = 'Queued' AND j.destination_id = d.id
          AND (d.pause_state IS NOT NULL OR t.paused_at IS NOT NULL)) AS held_jobs,
       f.detail AS last_failure, f.recorded_at AS last_failure_at,
       coalesce(c.state, 'closed') AS state, c.opened_at, c.next_probe_at, c.failures, c.last_error,
       c.updated_at,
       (SELECT count(*) FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = (hashtext(d.id::text)::bigint & 4294967295)::oid) AS sessions_in_use,
       (SELECT count(*) FROM export_jobs j
        WHERE j.tenant_id = d.tenant_id AND j.status = 'Queued' AND j.destination_id = d.id
          AND j.deferrals > 0) AS deferred_jobs
FROM destinations d
JOIN tenants t ON t.id = d.tenant_id
LEFT JOIN destination_circuits c ON c.destination_id = d.id
LEFT JOIN LATERAL (
    SELECT e.detail, e.recorded_at FROM export_jobs j
    JOIN export_attempt_events e ON e.job_id = j.id AND e.attempt_id = j.attempt_id
    WHERE j.tenant_id = d.tenant_id AND j.status = 'Failed' AND j.destination_id = d.id
      AND e.kind IN ('Failed', 'Finished', 'AttemptsExhausted', 'Reconciled', 'Corrected')
    ORDER BY e.recorded_at DESC LIMIT 1) f ON true
WHERE %(tenant_id)s::uuid IS NULL OR d.tenant_id = %(tenant_id)s::uuid
ORDER BY t.name, d.name, d.id;
