-- The operator's verbs for destinations and tenants (issue 20): a destination paused or draining, a tenant
-- paused, with who and why on the row; a destination's credential reference and contract flags changed
-- by an administrator; and each of those changes kept as history (directory_events, append-only).
-- A paused destination's or tenant's queued exports wait unclaimed: the worker reads the pause with the
-- job and does not claim, the sweeper leaves them be, and a resume wakes them in its own statement.
ALTER TABLE destinations ADD COLUMN pause_state text
    CONSTRAINT ck_destinations_pause_state CHECK (pause_state IN ('draining', 'paused'));
ALTER TABLE destinations ADD COLUMN paused_by text;
ALTER TABLE destinations ADD COLUMN paused_reason text;
ALTER TABLE destinations ADD COLUMN paused_at timestamptz;
ALTER TABLE destinations ADD CONSTRAINT ck_destinations_paused
    CHECK ((pause_state IS NULL) = (paused_by IS NULL) AND (pause_state IS NULL) = (paused_at IS NULL));

ALTER TABLE tenants ADD COLUMN paused_by text;
ALTER TABLE tenants ADD COLUMN paused_reason text;
ALTER TABLE tenants ADD COLUMN paused_at timestamptz;
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_paused CHECK ((paused_at IS NULL) = (paused_by IS NULL));

CREATE TABLE directory_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    destination_id  uuid,                              -- NULL: an event of the tenant itself
    kind            text NOT NULL CONSTRAINT ck_directory_events_kind
                        CHECK (kind IN ('Paused', 'Draining', 'Drained', 'Resumed', 'CredentialChanged',
                                        'ContractChanged')),
    changed_by      text NOT NULL,
    reason          text,
    detail          text,                              -- what changed: never a secret, only references
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT fk_directory_events_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id)
);
CREATE INDEX ix_directory_events_destination ON directory_events (destination_id, recorded_at);

CREATE TRIGGER tr_directory_events_append_only BEFORE UPDATE OR DELETE ON directory_events
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_directory_events_no_truncate BEFORE TRUNCATE ON directory_events
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

GRANT SELECT, INSERT ON directory_events TO exports_app;
GRANT UPDATE (credential_ref, remote_hash, acknowledgments, name_and_size_identify, read_back, pause_state,
              paused_by, paused_reason, paused_at) ON destinations TO exports_app;
GRANT UPDATE (paused_by, paused_reason, paused_at) ON tenants TO exports_app;
