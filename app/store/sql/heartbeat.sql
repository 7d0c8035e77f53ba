-- Process heartbeats: written by the processes themselves, read by health checks and operators only.

-- name: heartbeat_beat
-- A conditional upsert: a process that was recorded as stopped never comes back under its id, so a late
-- beat from a process that already said goodbye changes nothing. A process that started later under the
-- same host:pid is a new one (a container restarted with the same hostname runs as pid 1 again), and the
-- pid being in use again means the old one is gone: the new process takes the row over, rather than
-- staying invisible to `exports processes` and `exports health --require` until the old row is pruned.
INSERT INTO process_heartbeats AS h (process_id, role, host, pid, version, started_at, beat_at, parent_pid)
VALUES (%(process_id)s, %(role)s, %(host)s, %(pid)s, %(version)s, %(started_at)s, clock_timestamp(), %(parent_pid)s)
ON CONFLICT (process_id) DO UPDATE
SET beat_at = clock_timestamp(), version = EXCLUDED.version, role = EXCLUDED.role,
    started_at = EXCLUDED.started_at, stopped_at = NULL, parent_pid = EXCLUDED.parent_pid
WHERE (h.stopped_at IS NULL AND h.started_at = EXCLUDED.started_at) OR EXCLUDED.started_at > h.started_at
RETURNING process_id;

-- name: heartbeat_stop
-- A clean shutdown says so, so `exports processes` can tell a stopped process from a dead one.
UPDATE process_heartbeats
SET stopped_at = clock_timestamp()
WHERE process_id = %(process_id)s AND started_at = %(started_at)s AND stopped_at IS NULL
RETURNING process_id;

-- name: heartbeat_list
-- Every recorded process with its age, and for a worker the attempts it holds now (claimed_by is
-- host:pid:thread, so its prefix names the process).
SELECT h.process_id, h.role, h.host, h.pid, h.parent_pid, h.version, h.started_at, h.beat_at, h.stopped_at,
       extract(epoch FROM clock_timestamp() - h.beat_at) AS silent_seconds,
       coalesce(array_agg(j.attempt_id ORDER BY j.attempt_id) FILTER (WHERE j.attempt_id IS NOT NULL), '{}')
           AS attempts
FROM process_heartbeats h
LEFT JOIN export_jobs j
  ON h.role = 'worker' AND j.status IN ('Running', 'Delivering') AND j.claimed_by LIKE h.process_id || ':%%'
GROUP BY h.process_id
ORDER BY h.role, h.host, h.pid;

-- name: heartbeat_prune
-- One batch of the rows of processes dead for longer than the retention. A process died when it stopped
-- (stopped_at) or when it went silent (its last beat plus the silent limit); one that beats is never
-- taken, whatever the retention. A beat never follows a stop, so beat_at <= stopped_at and the bound on
-- beat_at, computed once (a scalar subquery), reaches every row due while it bounds the scan of
-- ix_process_heartbeats_beat. SKIP LOCKED leaves a row a beat is writing to the next run instead of
-- waiting for it, and the DELETE re-checks the death it found, so of two schedulers one deletes a row.
DELETE FROM process_heartbeats h
WHERE h.process_id IN (
    SELECT process_id FROM process_heartbeats
    WHERE beat_at < (SELECT clock_timestamp() - make_interval(secs => %(retention_seconds)s))
      AND coalesce(stopped_at, beat_at + make_interval(secs => %(silent_seconds)s))
          < (SELECT clock_timestamp() - make_interval(secs => %(retention_seconds)s))
    ORDER BY beat_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED)
  AND coalesce(h.stopped_at, h.beat_at + make_interval(secs => %(silent_seconds)s))
      < (SELECT clock_timestamp() - make_interval(secs => %(retention_seconds)s));
