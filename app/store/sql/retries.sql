-- The retry policy's read: proven non-deliveries of a transient cause that may be tried again. It creates
-- the replacement through export_create_replacement, which re-checks the original under its row lock.

-- name: retries_scan_due
-- A job qualifies when its delivery ended Failed (NotDelivered) after cutoff 2 with a transient cause (its
-- Finished event says so: the classifier proved nothing was written, and the connection was at fault); it
-- is the newest job of its delivery key; the key's original is Failed (NotDelivered) too, so an original
-- whose outcome is unknown is never retried; the key has fewer retry-policy jobs than its destination's
-- auto_retries (0: off); its failure is recent (the window) and older than the backoff for the next retry
-- (backoff * 2^retries so far). Oldest failure first. Never an incremental export: its schedule's next run
-- sends its changes again (the watermark did not move), and a retry beside that run could deliver older
-- contact states after newer ones.
SELECT j.id, j.tenant_id, j.attempt_id, j.delivery_key, j.overwrite_agreement_ref, d.original_job_id,
       e.detail, r.retries, dest.auto_retries
FROM export_jobs j
JOIN export_attempt_events e ON e.job_id = j.id AND e.attempt_id = j.attempt_id AND e.kind = 'Finished'
JOIN deliveries d ON d.tenant_id = j.tenant_id AND d.delivery_key = j.delivery_key
JOIN export_jobs o ON o.tenant_id = d.tenant_id AND o.id = d.original_job_id
JOIN destinations dest ON dest.tenant_id = j.tenant_id AND dest.id = j.destination_id
CROSS JOIN LATERAL (
    SELECT count(*) AS retries FROM export_jobs x
    WHERE x.tenant_id = j.tenant_id AND x.delivery_key = j.delivery_key AND x.created_by = %(created_by)s) r
WHERE j.status = 'Failed' AND j.failure_reason = 'NotDelivered' AND NOT j.incremental
  AND j.created_at > (SELECT clock_timestamp() - make_interval(secs => %(window_seconds)s))
  AND e.detail LIKE 'Failed NotDelivered (transient)%%'
  AND o.status = 'Failed' AND o.failure_reason = 'NotDelivered'
  AND NOT EXISTS (SELECT 1 FROM export_jobs n
                  WHERE n.tenant_id = j.tenant_id AND n.delivery_key = j.delivery_key AND n.created_at > j.created_at)
  AND r.retries < dest.auto_retries
  AND e.recorded_at <= clock_timestamp() - make_interval(secs => %(backoff_seconds)s * power(2, least(r.retries, 20)))
ORDER BY e.recorded_at
LIMIT %(batch_size)s;
