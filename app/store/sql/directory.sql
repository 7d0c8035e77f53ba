-- What the operator scripts set up before any export exists: tenants, their partner destinations,
-- who may act for them, and their contacts. None of these rows is part of the job protocol, but they
-- are written here like every other statement, by name, with parameters.

-- name: directory_add_tenant
INSERT INTO tenants (id, name) VALUES (%(tenant_id)s, %(name)s)
RETURNING id;

-- name: directory_add_destination
-- The destination holds a reference to its credential (env:NAME, keyfile:/path), never the secret; and
-- its delivery profile's first version, in the same statement (each row names the other).
WITH destination AS (
    INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir, host_key, credential_ref,
                              remote_hash, acknowledgments, name_and_size_identify, read_back, max_sessions,
                              auto_retries, profile_version, delivery_mode, bandwidth_limit)
    VALUES (%(destination_id)s, %(tenant_id)s, %(name)s, %(host)s, %(port)s, %(username)s, %(remote_dir)s,
            %(host_key)s, %(credential_ref)s, %(remote_hash)s, %(acknowledgments)s, %(name_and_size_identify)s,
            %(read_back)s, %(max_sessions)s, %(auto_retries)s, 1, %(delivery_mode)s, %(bandwidth_limit)s)
    RETURNING id)
INSERT INTO delivery_profiles (destination_id, version, profile, created_by)
SELECT id, 1, %(profile)s, %(created_by)s FROM destination
RETURNING destination_id;

-- name: directory_edit_profile
-- A new version of the destination's delivery profile, only over the version the editor read: of two
-- edits from the same version one commits, and the other matches no row (the destination's row lock
-- makes it wait, then re-check). Exports already running keep the version they read with their job.
WITH current AS (
    UPDATE destinations SET profile_version = profile_version + 1
    WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s AND profile_version = %(expected_version)s
    RETURNING id, profile_version)
INSERT INTO delivery_profiles (destination_id, version, profile, created_by)
SELECT id, profile_version, %(profile)s, %(created_by)s FROM current
RETURNING version;

-- name: directory_read_profile
-- A destination's delivery profile at a version (its current one when none is asked), only if the
-- destination belongs to the tenant.
SELECT p.version, p.profile, p.created_by, p.created_at, d.profile_version AS current_version
FROM destinations d
JOIN delivery_profiles p ON p.destination_id = d.id
 AND p.version = coalesce(%(version)s::int, d.profile_version)
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s;

-- name: directory_grant_operator
-- A second grant of a live pair changes nothing: access is widened or narrowed by no statement here,
-- so a grant that differs from the live one is reported, not applied. After a revoke, a grant is a new
-- row beside the revoked one, which stays as history.
INSERT INTO operator_access (operator_id, tenant_id, reconciliation)
VALUES (%(operator_id)s, %(tenant_id)s, %(reconciliation)s)
ON CONFLICT (operator_id, tenant_id) WHERE revoked_at IS NULL DO NOTHING
RETURNING id;

-- name: directory_revoke_operator
-- Ends the live grant of the pair, kept with who ended it and when; matches nothing when there is none
-- (never granted, or revoked already). A write by the operator that checked its grant before this
-- committed may still land: it was granted when it asked.
UPDATE operator_access SET revoked_by = %(revoked_by)s, revoked_at = clock_timestamp()
WHERE operator_id = %(operator_id)s AND tenant_id = %(tenant_id)s AND revoked_at IS NULL
RETURNING granted_at, reconciliation, revoked_at;

-- name: directory_copy_contacts
-- Bulk load through COPY: thousands of rows in one round trip, inside the caller's transaction, so an
-- import is all or nothing.
COPY contacts (tenant_id, email, full_name, company, phone, consent, attributes) FROM STDIN;

-- name: directory_read_destination
-- The job's destination, only if it belongs to the job's tenant.
SELECT id, tenant_id, host, port, username, remote_dir, host_key, credential_ref, remote_hash,
       acknowledgments, name_and_size_identify, read_back, active, max_sessions, auto_retries, more_host_keys,
       delivery_mode, bandwidth_limit
FROM destinations WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s;

-- name: directory_add_host_key
-- One more key the server may present (a partner rotating its key), only if it is not pinned already.
UPDATE destinations SET more_host_keys = more_host_keys || %(line)s::text
WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s
  AND host_key <> %(line)s AND NOT (%(line)s = ANY (more_host_keys))
RETURNING cardinality(more_host_keys) + 1 AS pinned;

-- name: directory_remove_host_key
-- A pinned key unpinned, only while another stays: the first of the others takes host_key's place when
-- host_key is the one removed. Matches nothing when the key is not pinned or is the last one.
UPDATE destinations
SET host_key = CASE WHEN host_key = %(line)s THEN more_host_keys[1] ELSE host_key END,
    more_host_keys = CASE WHEN host_key = %(line)s THEN more_host_keys[2:]
                          ELSE array_remove(more_host_keys, %(line)s::text) END
WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s AND cardinality(more_host_keys) > 0
  AND (host_key = %(line)s OR %(line)s = ANY (more_host_keys))
RETURNING cardinality(more_host_keys) + 1 AS pinned;

-- name: directory_set_delivery
-- The destination's delivery mode, bandwidth limit and sessions at once (each only when given: a NULL mode
-- or session count keeps it, and the limit is written only with set_limit). Mode no-rename publishes a file by its completion marker,
-- so it is written only while the current profile writes one; matches nothing otherwise.
UPDATE destinations d
SET delivery_mode = coalesce(%(delivery_mode)s, d.delivery_mode),
    bandwidth_limit = CASE WHEN %(set_limit)s THEN %(bandwidth_limit)s::bigint ELSE d.bandwidth_limit END,
    max_sessions = coalesce(%(max_sessions)s::int, d.max_sessions)
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s
  AND (coalesce(%(delivery_mode)s, d.delivery_mode) <> 'no-rename'
       OR EXISTS (SELECT 1 FROM delivery_profiles p
                  WHERE p.destination_id = d.id AND p.version = d.profile_version
                    AND coalesce(p.profile->>'marker', 'none') <> 'none'))
RETURNING delivery_mode, bandwidth_limit, max_sessions;
