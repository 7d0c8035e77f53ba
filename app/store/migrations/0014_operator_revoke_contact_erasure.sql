-- The operator's verbs of issue 20 that need the schema: a grant can be revoked, a contact erased, and a
-- worker process's heartbeat names the process to signal.
--
-- A revoked grant stays on record with who revoked it and when; granting again makes a new row, so every
-- period of access is kept, and at most one row per operator and tenant is live (unrevoked).
ALTER TABLE operator_access DROP CONSTRAINT pk_operator_access;
ALTER TABLE operator_access ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY
    CONSTRAINT pk_operator_access PRIMARY KEY;
ALTER TABLE operator_access ADD COLUMN revoked_by text;
ALTER TABLE operator_access ADD COLUMN revoked_at timestamptz;
ALTER TABLE operator_access ADD CONSTRAINT ck_operator_access_revoked
    CHECK ((revoked_at IS NULL) = (revoked_by IS NULL));
CREATE UNIQUE INDEX uq_operator_access_live ON operator_access (operator_id, tenant_id) WHERE revoked_at IS NULL;
GRANT UPDATE (revoked_by, revoked_at) ON operator_access TO exports_app;

-- An erasure (GDPR) deletes the tenant's contacts of one address. What is kept says that it happened, by
-- whom and how many rows went, never the address: the record of an erasure must not hold what it erased.
CREATE TABLE contact_erasures (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    erased_by        text NOT NULL,
    reason           text,
    contacts_erased  int  NOT NULL CHECK (contacts_erased >= 0),
    recorded_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ix_contact_erasures_tenant ON contact_erasures (tenant_id, recorded_at);
CREATE TRIGGER tr_contact_erasures_append_only BEFORE UPDATE OR DELETE ON contact_erasures
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_contact_erasures_no_truncate BEFORE TRUNCATE ON contact_erasures
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
GRANT DELETE ON contacts TO exports_app;
GRANT SELECT, INSERT ON contact_erasures TO exports_app;

-- A worker process is a child of its `exports worker`, the process a supervisor or an operator signals.
ALTER TABLE process_heartbeats ADD COLUMN parent_pid int;
GRANT UPDATE (parent_pid) ON process_heartbeats TO exports_app, exports_dispatcher, exports_notifier;
