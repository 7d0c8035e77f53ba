-- An administrator's edits of a destination's connection and contract: its credential reference and the
-- partner's contract flags. Each writes only over the values the editor read (of two edits from the same
-- values, one commits and the other matches nothing) and records its directory_events row in the same
-- statement. An attempt reads the destination once, before its claim: the edit applies to the attempts
-- that start after it commits.

-- name: edits_set_credential
-- The reference changes, never the secret: the event records both references (where the secret is, as the
-- destination's row already holds), never what they resolve to.
WITH changed AS (
    UPDATE destinations SET credential_ref = %(credential_ref)s
    WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s AND credential_ref = %(expected)s
      AND credential_ref <> %(credential_ref)s
    RETURNING tenant_id, id)
INSERT INTO directory_events (tenant_id, destination_id, kind, changed_by, reason, detail)
SELECT tenant_id, id, 'CredentialChanged', %(changed_by)s, %(reason)s, %(expected)s || ' -> ' || %(credential_ref)s
FROM changed
RETURNING recorded_at;

-- name: edits_set_contract
-- The contract flags the evidence rules depend on (remote hashing, acknowledgments, whether name and size
-- identify a file, read-back), all four written over the four read.
WITH changed AS (
    UPDATE destinations
    SET remote_hash = %(remote_hash)s, acknowledgments = %(acknowledgments)s,
        name_and_size_identify = %(name_and_size_identify)s, read_back = %(read_back)s
    WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s
      AND (remote_hash, acknowledgments, name_and_size_identify, read_back)
          = (%(was_remote_hash)s, %(was_acknowledgments)s, %(was_name_and_size_identify)s, %(was_read_back)s)
    RETURNING tenant_id, id)
INSERT INTO directory_events (tenant_id, destination_id, kind, changed_by, reason, detail)
SELECT tenant_id, id, 'ContractChanged', %(changed_by)s, %(reason)s, %(detail)s FROM changed
RETURNING recorded_at;
