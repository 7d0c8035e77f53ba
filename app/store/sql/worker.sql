-- What the worker reads around its writes. The message is a hint: every decision starts from these.

-- name: worker_read_job
-- Everything the runner decides on before its claim, in one round trip, re-read from the rows rather than
-- taken from the message: the job, with how often and since how long (on the database's clock) it has
-- been deferred, for the next backoff and the deferral budget; its destination, only if it belongs to
-- the job's tenant (no row: the policy refuses it); the destination's circuit (no row: closed); and for a
-- replacement its original as cutoff 2 recorded it, what a file under the shared final name must match to
-- be identified as the original's delivery (final: the original ended before the replacement was made);
-- the file name the key delivers under, and the destination's current delivery profile, which the
-- attempt builds with from its first byte to its last, whatever edit commits meanwhile; and, for an
-- incremental export, the snapshot it sends the changes since. And whether its tenant or its destination is
-- paused (or draining): then it waits unclaimed, and the resume wakes it (sql/pausing.sql).
SELECT j.id, j.tenant_id, j.status, j.version, j.destination_id, j.delivery_key, j.replaces_job_id,
       j.incremental, j.incremental_since::text AS incremental_since, k.file_name, p.version AS profile_version, p.profile,
       j.overwrite_agreement_ref, j.deferrals,
       extract(epoch FROM clock_timestamp() - j.deferred_since) AS deferred_for_seconds, j.last_deferral,
       d.id AS destination_found, d.host, d.port, d.username, d.remote_dir, d.host_key, d.credential_ref,
       d.remote_hash, d.acknowledgments, d.name_and_size_identify, d.read_back, d.active, d.max_sessions,
       d.auto_retries, d.more_host_keys, d.delivery_mode, d.bandwidth_limit,
       c.state AS circuit_state, c.failures AS circuit_failures, c.last_error AS circuit_last_error,
       extract(epoch FROM c.next_probe_at - clock_timestamp()) AS circuit_probe_in_seconds,
       coalesce(c.probe_attempt_id IS NOT NULL AND c.probe_until > clock_timestamp(), false) AS circuit_probe_held,
       o.expected_file_name AS original_file_name, o.expected_file_bytes AS original_file_bytes,
       o.expected_file_sha256 AS original_file_sha256,
       CASE WHEN t.paused_at IS NOT NULL THEN 'tenant paused'
            WHEN d.pause_state IS NOT NULL THEN 'destination ' || d.pause_state END AS held
FROM export_jobs j
JOIN deliveries k ON k.tenant_id = j.tenant_id AND k.delivery_key = j.delivery_key
JOIN tenants t ON t.id = j.tenant_id
LEFT JOIN destinations d ON d.tenant_id = j.tenant_id AND d.id = j.destination_id
LEFT JOIN delivery_profiles p ON p.destination_id = d.id AND p.version = d.profile_version
LEFT JOIN destination_circuits c ON c.destination_id = j.destination_id
LEFT JOIN export_jobs o ON o.tenant_id = j.tenant_id AND o.id = j.replaces_job_id
WHERE j.id = %(job_id)s;

-- name: worker_confirm_stops
-- Which of the watched attempts have a recorded stop request, confirmed on the row itself.
SELECT j.id
FROM export_jobs j
JOIN unnest(%(job_ids)s::uuid[], %(attempt_ids)s::uuid[]) AS w (job_id, attempt_id)
  ON j.id = w.job_id AND j.attempt_id = w.attempt_id
WHERE j.status = 'Running' AND j.stop_request_id IS NOT NULL;

-- name: worker_copy_consenting_contacts
-- PostgreSQL writes the partner's rows itself. What the profile chooses is composed in by
-- app.store.worker.ContactsCopy (psycopg identifiers and literals, never text): the columns (contact
-- fields and custom fields), the options (CSV's delimiter and quoting) and, for a preview, a limit.
-- COPY takes no server-side parameters, so psycopg binds the tenant id client-side as a quoted literal.
COPY (SELECT {columns} FROM contacts
      WHERE tenant_id = %(tenant_id)s AND consent ORDER BY id {limit})
TO STDOUT WITH ({options});

-- name: worker_begin_snapshot
-- An incremental build reads in one REPEATABLE READ transaction: the snapshot it records for cutoff 2 is
-- the one its COPY reads.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: worker_read_snapshot
-- The transaction's snapshot (in REPEATABLE READ, the active snapshot is the transaction's), taken by this
-- first query: the next run sends what it could not see.
SELECT pg_current_snapshot()::text AS snapshot;

-- name: worker_copy_changed_contacts
-- An incremental export's rows: the tenant's contacts last written by a transaction the last Completed
-- run's snapshot could not see (%(since)s; NULL: every contact, the first run), consenting ones, and
-- those whose consent was withdrawn, marked for deletion (ContactsCopy adds the _change column): never a
-- contact that never consented. changed_xid at or above the snapshot's xmin is implied, and lets the
-- index narrow the scan. Run in the transaction worker_begin_snapshot opened.
COPY (SELECT {columns} FROM contacts
      WHERE tenant_id = %(tenant_id)s
        AND (consent OR (%(since)s::pg_snapshot IS NOT NULL AND consent_withdrawn_at IS NOT NULL))
        AND (%(since)s::pg_snapshot IS NULL
             OR (changed_xid >= pg_snapshot_xmin(%(since)s::pg_snapshot)
                 AND NOT pg_visible_in_snapshot(changed_xid, %(since)s::pg_snapshot)))
      ORDER BY id {limit})
TO STDOUT WITH ({options});
