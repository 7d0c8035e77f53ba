-- A tenant's webhook endpoints (the application's role), and the notifier's side of webhook_deliveries
-- (exports_notifier): claim due deliveries, record each request's answer. The deliveries themselves are
-- inserted by the statements that give an export its outcome (export.sql, recovery.sql,
-- cancellation.sql), in the same statement as the transition.

-- name: webhooks_add_endpoint
-- A name taken by a live endpoint of the tenant is uq_webhook_endpoints_live_name; an unknown tenant
-- the foreign key: both answers, not bugs.
INSERT INTO webhook_endpoints (id, tenant_id, name, url, allow_http, secret_ref, created_by)
VALUES (%(endpoint_id)s, %(tenant_id)s, %(name)s, %(url)s, %(allow_http)s, %(secret_ref)s, %(created_by)s)
RETURNING id;

-- name: webhooks_remove_endpoint
-- From now on no outcome is queued for it; what it was still owed, the notifier drops (and records so).
UPDATE webhook_endpoints
SET removed_at = clock_timestamp(), removed_by = %(removed_by)s
WHERE tenant_id = %(tenant_id)s AND id = %(endpoint_id)s AND removed_at IS NULL
RETURNING id;

-- name: webhooks_list_endpoints
-- A tenant's live endpoints (or every tenant's), each with what it is owed (pending, and since when), what
-- was given up (dead), its newest event and the answer to the newest request for it. Each figure reads
-- an index, however long the endpoint's history.
SELECT e.id, e.tenant_id, t.name AS tenant_name, e.name, e.url, e.allow_http, e.secret_ref, e.created_by,
       e.created_at,
       (SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'pending') AS pending,
       (SELECT min(d.occurred_at) FROM webhook_deliveries d
        WHERE d.endpoint_id = e.id AND d.state = 'pending') AS oldest_pending,
       (SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'dead') AS dead,
       (SELECT max(d.occurred_at) FROM webhook_deliveries d WHERE d.endpoint_id = e.id) AS newest_event,
       (SELECT coalesce('HTTP ' || a.http_status, a.error) FROM webhook_deliveries d
        JOIN LATERAL (SELECT http_status, error FROM webhook_attempts
                      WHERE delivery_id = d.id ORDER BY attempt DESC LIMIT 1) a ON true
        WHERE d.endpoint_id = e.id AND d.attempts > 0
        ORDER BY d.occurred_at DESC LIMIT 1) AS last_result
FROM webhook_endpoints e
JOIN tenants t ON t.id = e.tenant_id
WHERE e.removed_at IS NULL AND (%(tenant_id)s::uuid IS NULL OR e.tenant_id = %(tenant_id)s::uuid)
ORDER BY t.name, e.name;

-- name: webhooks_find_endpoint
-- One live endpoint of the tenant, by id or by name.
SELECT id, tenant_id, name, url, allow_http, secret_ref, created_by, created_at
FROM webhook_endpoints
WHERE tenant_id = %(tenant_id)s AND removed_at IS NULL
  AND (id = %(endpoint_id)s::uuid OR name = %(name)s::text)
ORDER BY name
LIMIT 2;

-- name: webhooks_recent_deliveries
-- An endpoint's newest deliveries, each with its latest attempt's answer.
SELECT d.id, d.job_id, d.status, d.failure_reason, d.source, d.occurred_at, d.state, d.attempts,
       d.next_attempt_at, d.finished_at,
       (SELECT coalesce('HTTP ' || a.http_status, a.error) FROM webhook_attempts a
        WHERE a.delivery_id = d.id ORDER BY a.attempt DESC LIMIT 1) AS last_result
FROM webhook_deliveries d
WHERE d.endpoint_id = %(endpoint_id)s
ORDER BY d.occurred_at DESC
LIMIT %(limit)s;

-- name: webhooks_claim_batch
-- Due deliveries, oldest due first, leased to this notifier: attempts + 1 and the next try pushed past
-- the lease, committed before any request goes out, so no transaction stays open while a receiver
-- answers (or does not). A notifier that dies mid-send leaves the delivery due again when its lease ends,
-- and the next one sends the same event under the same id. SKIP LOCKED: notifiers claim disjoint
-- batches. A delivery whose endpoint was removed is dropped instead, and returned as such. Each claimed
-- delivery comes with what its body needs: the endpoint, and the job's facts fixed by its outcome.
-- Endpoints take turns: a live endpoint gets at most one delivery per batch, its turn, and none while the
-- delivery first in its line is leased (a request in flight) or resting after a failure (due later): one
-- request at a time per endpoint, across notifiers, and a failing endpoint is tried once per backoff, by
-- its failing delivery (the most attempts first), so a dead receiver costs one timeout per rest instead of
-- one per event and holds one notifier thread, never all of them. Its other events wait in order.
WITH turn AS (
    SELECT next.id
    FROM webhook_endpoints e
    CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
        WHERE d.endpoint_id = e.id AND d.state = 'pending'
        ORDER BY d.attempts DESC, d.next_attempt_at, d.id
        LIMIT 1) AS next
    WHERE e.removed_at IS NULL AND next.next_attempt_at <= (SELECT clock_timestamp())
    UNION ALL
    SELECT d.id
    FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
    WHERE e.removed_at IS NOT NULL AND d.state = 'pending'),
due AS (
    SELECT d.id, e.removed_at IS NOT NULL AS removed
    FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
    WHERE d.id IN (SELECT id FROM turn) AND d.state = 'pending' AND d.next_attempt_at <= (SELECT clock_timestamp())
    ORDER BY d.next_attempt_at
    LIMIT %(batch_size)s
    FOR UPDATE OF d SKIP LOCKED),
claimed AS (
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + CASE WHEN due.removed THEN 0 ELSE 1 END,
        state = CASE WHEN due.removed THEN 'dropped' ELSE 'pending' END,
        finished_at = CASE WHEN due.removed THEN clock_timestamp() END,
        next_attempt_at = CASE WHEN due.removed THEN d.next_attempt_at
                               ELSE clock_timestamp() + make_interval(secs => %(lease_seconds)s) END
    FROM due
    WHERE d.id = due.id AND d.state = 'pending'
    RETURNING d.id, d.endpoint_id, d.tenant_id, d.job_id, d.attempt_id, d.status, d.failure_reason, d.source,
              d.occurred_at, d.attempts, due.removed)
SELECT c.id, c.endpoint_id, c.tenant_id, c.job_id, c.attempt_id, c.status, c.failure_reason, c.source,
       c.occurred_at, c.attempts AS attempt, c.removed, e.name AS endpoint_name, e.url, e.secret_ref,
       j.delivery_key, j.attempt_count, j.expected_file_bytes, j.expected_file_sha256, j.replaces_job_id,
       f.file_name
FROM claimed c
JOIN webhook_endpoints e ON e.id = c.endpoint_id
LEFT JOIN export_jobs j ON j.id = c.job_id
LEFT JOIN deliveries f ON f.tenant_id = j.tenant_id AND f.delivery_key = j.delivery_key
ORDER BY c.occurred_at, c.id;

-- name: webhooks_record_attempt
-- One request's answer, recorded under its claim's attempt number whoever holds the delivery now, and
-- the delivery's next state in the same statement: delivered on a 2xx (answering any claim: the receiver
-- has the event); otherwise, only while this claim is still the delivery's latest, due again after the
-- backoff, or dead once that next try would fall past the give-up horizon (counted from the outcome, or
-- from an operator's redelivery).
WITH attempt AS (
    INSERT INTO webhook_attempts (delivery_id, attempt, sender, started_at, http_status, error)
    VALUES (%(delivery_id)s, %(attempt)s, %(sender)s, %(started_at)s, %(http_status)s, %(error)s)),
next AS (
    SELECT id,
           CASE WHEN %(delivered)s THEN 'delivered'
                WHEN coalesce(revived_at, occurred_at) + make_interval(secs => %(give_up_seconds)s)
                     < clock_timestamp() + make_interval(secs => %(retry_in_seconds)s) THEN 'dead'
                ELSE 'pending' END AS state
    FROM webhook_deliveries
    WHERE id = %(delivery_id)s),
moved AS (
    UPDATE webhook_deliveries d
    SET state = next.state,
        next_attempt_at = CASE WHEN next.state = 'pending'
                               THEN clock_timestamp() + make_interval(secs => %(retry_in_seconds)s)
                               ELSE d.next_attempt_at END,
        finished_at = CASE WHEN next.state = 'pending' THEN NULL ELSE clock_timestamp() END
    FROM next
    WHERE d.id = next.id AND d.state = 'pending' AND (%(delivered)s OR d.attempts = %(attempt)s)
    RETURNING d.state)
SELECT state FROM moved;

-- name: webhooks_release
-- Claimed deliveries a stopping notifier did not send: due again at once, their claim not counted, so the
-- next notifier need not wait for the lease to end. Only while each is still this notifier's claim.
UPDATE webhook_deliveries d
SET attempts = d.attempts - 1, next_attempt_at = clock_timestamp()
FROM unnest(%(delivery_ids)s::uuid[], %(attempts)s::int[]) AS c (id, attempt)
WHERE d.id = c.id AND d.state = 'pending' AND d.attempts = c.attempt
RETURNING d.id;

-- name: webhooks_dead_deliveries
-- What `webhook redeliver --dry-run` would send again: the endpoint's given-up deliveries since a time.
SELECT d.id, d.job_id, d.status, d.occurred_at, d.finished_at
FROM webhook_deliveries d
WHERE d.tenant_id = %(tenant_id)s AND d.endpoint_id = %(endpoint_id)s AND d.state = 'dead'
  AND (%(since)s::timestamptz IS NULL OR d.occurred_at >= %(since)s::timestamptz)
ORDER BY d.occurred_at, d.id;

-- name: webhooks_redeliver
-- An operator sends again what was given up: each dead delivery of the live endpoint since a time is
-- pending and due at once, under its id, its horizon counted from now. Only dead ones (a delivered,
-- dropped or pending delivery is left as it is), and only while the endpoint is live: a removed
-- endpoint's would be dropped at their claim anyway.
UPDATE webhook_deliveries d
SET state = 'pending', next_attempt_at = clock_timestamp(), finished_at = NULL,
    revived_at = clock_timestamp(), revived_by = %(revived_by)s
FROM webhook_endpoints e
WHERE e.tenant_id = %(tenant_id)s AND e.id = %(endpoint_id)s AND e.removed_at IS NULL
  AND d.tenant_id = e.tenant_id AND d.endpoint_id = e.id AND d.state = 'dead'
  AND (%(since)s::timestamptz IS NULL OR d.occurred_at >= %(since)s::timestamptz)
RETURNING d.id, d.job_id, d.status, d.occurred_at;
