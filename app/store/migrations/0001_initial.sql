-- The first release's schema (schema_version 1), kept unchanged as the baseline the numbered migrations
-- start from. A new database gets schema.sql, the current schema, in one step; this file is applied only
-- by the test that proves 0001 and every later migration end where schema.sql does.

-- The exports schema: the reference design's five tables exactly, the tables it leaves to the
-- application (tenants, destinations, contacts, operator_access), the three roles and their grants,
-- and the triggers that make history append-only even for the owner.
--
-- Applied by `exports db migrate` inside one transaction under an advisory lock; the migration
-- records schema_version 1 and skips the file when that version is already recorded.

-- Roles are cluster-wide, so they may already exist (another database, an earlier run).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_app') THEN
        CREATE ROLE exports_app NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_dispatcher') THEN
        CREATE ROLE exports_dispatcher NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_reconciler') THEN
        CREATE ROLE exports_reconciler NOLOGIN;
    END IF;
END
$$;

CREATE TABLE schema_version (
    version     int PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- ---------------------------------------------------------------------------------------------
-- What the application adds: tenants, their partner destinations, their contacts, and who may act.
-- ---------------------------------------------------------------------------------------------

CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A destination holds a *reference* to its credential (an environment variable or a key file
-- path), never the secret, and the partner's contract capabilities the evidence rules depend on.
CREATE TABLE destinations (
    id                      uuid PRIMARY KEY,
    tenant_id               uuid NOT NULL REFERENCES tenants (id),
    name                    text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    host                    text NOT NULL,
    port                    int  NOT NULL CHECK (port BETWEEN 1 AND 65535),
    username                text NOT NULL,
    remote_dir              text NOT NULL,
    host_key                text NOT NULL,             -- one known_hosts line, pinned
    credential_ref          text NOT NULL CHECK (credential_ref ~ '^(env|keyfile|env-keyfile):.+$'),
    remote_hash             boolean NOT NULL DEFAULT false,   -- server answers check-file-name sha256
    acknowledgments         boolean NOT NULL DEFAULT false,   -- partner writes <final>.ack
    name_and_size_identify  boolean NOT NULL DEFAULT false,   -- contract: name and size identify a file
    read_back               boolean NOT NULL DEFAULT false,   -- contract allows downloading to hash
    active                  boolean NOT NULL DEFAULT true,
    created_at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT uq_destinations_tenant UNIQUE (tenant_id, id)
);

CREATE TABLE contacts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    email       text NOT NULL,
    full_name   text NOT NULL,
    company     text,
    phone       text,
    consent     boolean NOT NULL DEFAULT false,   -- the export policy only ships consenting contacts
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ix_contacts_tenant ON contacts (tenant_id, id);

CREATE TABLE operator_access (
    operator_id     text NOT NULL,
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    reconciliation  boolean NOT NULL DEFAULT false,   -- may correct recorded outcomes
    granted_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_operator_access PRIMARY KEY (operator_id, tenant_id)
);

-- ---------------------------------------------------------------------------------------------
-- The reference design's five tables, exactly.
-- ---------------------------------------------------------------------------------------------

CREATE TABLE export_jobs (
    id                       uuid PRIMARY KEY,          -- globally unique
    tenant_id                uuid NOT NULL,
    status                   text NOT NULL CHECK (status IN ('Queued', 'Running', 'Delivering', 'Canceled',
                                 'Rejected', 'Stopped', 'Failed', 'Completed', 'OutcomeUnknown')),
    version                  int  NOT NULL,             -- version of the terms; every terms edit increments it
    destination_id           uuid NOT NULL,
    attempt_id               uuid,                      -- current attempt, if any
    attempt_count            int  NOT NULL DEFAULT 0,
    claimed_by               text,
    lease_expires_at         timestamptz,
    stop_request_id          uuid,                      -- the first stop request
    cancellation_request_id  uuid,                      -- the request that canceled it while queued
    expected_file_name       text,                      -- recorded at cutoff 2
    expected_file_bytes      bigint,
    expected_file_sha256     bytea,
    delivery_authorized_at   timestamptz,
    woken_at                 timestamptz NOT NULL,      -- last wake-up message written for this job
    failure_reason           text CHECK (failure_reason IN ('BuildFailed', 'AttemptsExhausted', 'NotDelivered',
                                 'FinalNameOccupied', 'OriginalDelivered')),
    delivery_key             text NOT NULL,             -- partner-facing identity; the final file name is built from it
    replaces_job_id          uuid,                      -- set on a replacement job; always names the original
    created_by               text NOT NULL,             -- the operator or client that created the job
    replacement_reason       text,                      -- replacements only: why, in the creator's words
    overwrite_agreement_ref  text,                      -- replacements only: the partner's recorded overwrite agreement
    sweep_count              int  NOT NULL DEFAULT 0,   -- times the sweeper republished this job
    CONSTRAINT uq_export_jobs_tenant UNIQUE (tenant_id, id),
    CONSTRAINT ck_export_jobs_replacement CHECK ((replaces_job_id IS NULL) = (replacement_reason IS NULL)),
    CONSTRAINT ck_export_jobs_overwrite CHECK (overwrite_agreement_ref IS NULL OR replaces_job_id IS NOT NULL),
    CONSTRAINT ck_export_jobs_failure CHECK ((status = 'Failed') = (failure_reason IS NOT NULL))
);

-- Not in the reference, but a job must name a destination of its own tenant.
ALTER TABLE export_jobs
    ADD CONSTRAINT fk_export_jobs_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id);

-- One row per delivery key, written by the statement that creates the original job.
CREATE TABLE deliveries (
    tenant_id        uuid NOT NULL,
    delivery_key     text NOT NULL,
    original_job_id  uuid NOT NULL,
    CONSTRAINT pk_deliveries PRIMARY KEY (tenant_id, delivery_key),
    CONSTRAINT uq_deliveries_original UNIQUE (tenant_id, delivery_key, original_job_id),
    CONSTRAINT fk_deliveries_original FOREIGN KEY (tenant_id, original_job_id)
        REFERENCES export_jobs (tenant_id, id) DEFERRABLE INITIALLY DEFERRED   -- the two rows reference each other
);

ALTER TABLE export_jobs
    ADD CONSTRAINT fk_export_jobs_delivery FOREIGN KEY (tenant_id, delivery_key)
        REFERENCES deliveries (tenant_id, delivery_key),
    ADD CONSTRAINT fk_export_jobs_replaces FOREIGN KEY (tenant_id, delivery_key, replaces_job_id)
        REFERENCES deliveries (tenant_id, delivery_key, original_job_id);   -- same tenant, same key, the original

-- Only an original mints a key, so two originals can never share one, even if inserted directly.
CREATE UNIQUE INDEX uq_export_jobs_original_key ON export_jobs (tenant_id, delivery_key) WHERE replaces_job_id IS NULL;

-- At most one replacement per original that is live, has delivered, or found the original's file. One that
-- ended without delivering anything frees the slot.
CREATE UNIQUE INDEX uq_export_jobs_one_replacement ON export_jobs (tenant_id, replaces_job_id)
    WHERE replaces_job_id IS NOT NULL
      AND (status NOT IN ('Canceled', 'Rejected', 'Stopped', 'Failed') OR failure_reason = 'OriginalDelivered');

-- Recovery finds expired leases; the sweeper finds queued jobs whose last wake-up is old.
CREATE INDEX ix_export_jobs_lease ON export_jobs (lease_expires_at) WHERE status IN ('Running', 'Delivering');
CREATE INDEX ix_export_jobs_woken ON export_jobs (woken_at) WHERE status = 'Queued';
-- Operators list a tenant's jobs by state.
CREATE INDEX ix_export_jobs_tenant_status ON export_jobs (tenant_id, status);

CREATE TABLE export_attempt_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES export_jobs (id),
    attempt_id   uuid NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('Claimed', 'DeliveryAuthorized', 'Stopped', 'Failed',
                     'Finished', 'RequeuedByRecovery', 'StoppedByRecovery', 'AttemptsExhausted',
                     'ResolvedByRecovery', 'Reconciled', 'Corrected', 'DeliveryEvidence')),
    version      int,
    worker_id    text,
    observed_by  text,               -- for delivery evidence: the worker attempt or the recovery run
    detail       text,
    recorded_at  timestamptz NOT NULL
);

-- Each transition happens at most once per attempt; evidence may be appended many times.
CREATE UNIQUE INDEX uq_attempt_transition ON export_attempt_events (job_id, attempt_id, kind)
    WHERE kind <> 'DeliveryEvidence';

CREATE TABLE cancellation_requests (
    tenant_id                     uuid NOT NULL,
    id                            uuid NOT NULL,       -- supplied by the client, once per click
    job_id                        uuid NOT NULL,
    requested_by                  text NOT NULL,
    reason                        text,
    outcome                       text NOT NULL,
    found_status                  text NOT NULL,
    found_attempt_id              uuid,
    found_attempt_count           int  NOT NULL,
    found_delivery_authorized_at  timestamptz,
    recorded_at                   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_cancellation_requests PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_cancellation_requests_job FOREIGN KEY (tenant_id, job_id)
        REFERENCES export_jobs (tenant_id, id)            -- a request cannot name another tenant's job
);

-- Ours: the outcome and the found status are codes the console and alerts rely on.
ALTER TABLE cancellation_requests
    ADD CONSTRAINT ck_cancellation_requests_outcome CHECK (outcome IN ('CanceledWhileQueued', 'StopRequested',
        'StopAlreadyRequested', 'AlreadyCanceled', 'AlreadyEnded', 'TooLate')),
    ADD CONSTRAINT ck_cancellation_requests_found_status CHECK (found_status IN ('Queued', 'Running', 'Delivering',
        'Canceled', 'Rejected', 'Stopped', 'Failed', 'Completed', 'OutcomeUnknown'));

CREATE TABLE outbox (
    message_id    uuid PRIMARY KEY,    -- a new ID for every row; reused only when the dispatcher retries this row
    kind          text NOT NULL,
    job_id        uuid NOT NULL,
    created_at    timestamptz NOT NULL,
    published_at  timestamptz
);

-- The relay pages through unpublished rows oldest first.
CREATE INDEX ix_outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;

-- Queue tables churn dead tuples (every claim, renewal and publication rewrites a row); vacuum them
-- far sooner than the global defaults would.
ALTER TABLE outbox SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000,
                        autovacuum_vacuum_insert_scale_factor = 0.0, autovacuum_vacuum_insert_threshold = 5000,
                        autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);
ALTER TABLE export_jobs SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 500,
                             autovacuum_analyze_scale_factor = 0.02, fillfactor = 70);

-- ---------------------------------------------------------------------------------------------
-- Append-only by the database, not by convention.
-- ---------------------------------------------------------------------------------------------

-- Refuses UPDATE, DELETE and TRUNCATE, even to the owner and superusers, who bypass grants.
CREATE FUNCTION refuse_history_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is not allowed: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER tr_export_attempt_events_append_only BEFORE UPDATE OR DELETE ON export_attempt_events
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_export_attempt_events_no_truncate BEFORE TRUNCATE ON export_attempt_events
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_cancellation_requests_append_only BEFORE UPDATE OR DELETE ON cancellation_requests
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_cancellation_requests_no_truncate BEFORE TRUNCATE ON cancellation_requests
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_deliveries_no_truncate BEFORE TRUNCATE ON deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- The outbox is insert-only apart from its publication status: nobody deletes, and an update may
-- change published_at alone.
CREATE FUNCTION refuse_outbox_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.message_id, NEW.kind, NEW.job_id, NEW.created_at)
           IS NOT DISTINCT FROM (OLD.message_id, OLD.kind, OLD.job_id, OLD.created_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% on outbox is not allowed: only published_at may change', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER tr_outbox_insert_only BEFORE UPDATE OR DELETE ON outbox
    FOR EACH ROW EXECUTE FUNCTION refuse_outbox_change();
CREATE TRIGGER tr_outbox_no_truncate BEFORE TRUNCATE ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_outbox_change();

-- A recorded Completed or Failed changes only through a correction, and a correction is made only by
-- a reconciliation operator: the worker's and the API's role share the table's UPDATE grant, so the
-- grant alone cannot tell them apart. Both the row change and its Corrected event are guarded.
CREATE FUNCTION refuse_outcome_change_without_reconciler() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'export_jobs' THEN
        IF OLD.status IN ('Completed', 'Failed') AND NEW.status IS DISTINCT FROM OLD.status
           AND NOT pg_has_role(current_user, 'exports_reconciler', 'USAGE') THEN
            RAISE EXCEPTION 'a recorded % outcome is corrected only by a reconciliation operator', OLD.status
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF NEW.kind = 'Corrected' AND NOT pg_has_role(current_user, 'exports_reconciler', 'USAGE') THEN
        RAISE EXCEPTION 'Corrected events are recorded only by a reconciliation operator'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER tr_export_jobs_outcome_guard BEFORE UPDATE ON export_jobs
    FOR EACH ROW EXECUTE FUNCTION refuse_outcome_change_without_reconciler();
CREATE TRIGGER tr_export_attempt_events_corrected_guard BEFORE INSERT ON export_attempt_events
    FOR EACH ROW EXECUTE FUNCTION refuse_outcome_change_without_reconciler();

-- ---------------------------------------------------------------------------------------------
-- Wake-ups. NOTIFY takes a global lock at commit, so it stays off the claim and renewal paths: it
-- fires only for a recorded stop request (the watcher's fast path) and for new outbox rows (the relay's).
-- ---------------------------------------------------------------------------------------------

CREATE FUNCTION notify_stop_request() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('exports_stop', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER tr_export_jobs_notify_stop AFTER UPDATE OF stop_request_id ON export_jobs
    FOR EACH ROW WHEN (OLD.stop_request_id IS NULL AND NEW.stop_request_id IS NOT NULL)
    EXECUTE FUNCTION notify_stop_request();

CREATE FUNCTION notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('exports_outbox', '');   -- identical payloads fold into one per transaction
    RETURN NULL;
END
$$;

CREATE TRIGGER tr_outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION notify_outbox();

-- ---------------------------------------------------------------------------------------------
-- Grants. Every process connects under one of these roles, so a missing or excess grant fails a test.
-- ---------------------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;

-- exports_app: the API, the worker, recovery, the sweeper and the operator scripts.
GRANT SELECT, INSERT ON tenants, destinations, contacts, operator_access TO exports_app;
GRANT UPDATE (active) ON destinations TO exports_app;
GRANT SELECT, INSERT, UPDATE ON export_jobs TO exports_app;
GRANT SELECT, INSERT ON deliveries, export_attempt_events, cancellation_requests TO exports_app;
GRANT SELECT, INSERT ON outbox TO exports_app;
GRANT SELECT ON schema_version TO exports_app;

-- exports_dispatcher: the relay reads the outbox and marks publication, nothing more.
GRANT SELECT ON outbox TO exports_dispatcher;
GRANT UPDATE (published_at) ON outbox TO exports_dispatcher;

-- exports_reconciler: corrections of recorded outcomes, with their event.
GRANT SELECT ON export_jobs, export_attempt_events, tenants, operator_access TO exports_reconciler;
GRANT UPDATE (status, failure_reason) ON export_jobs TO exports_reconciler;
GRANT INSERT ON export_attempt_events TO exports_reconciler;

INSERT INTO schema_version (version) VALUES (1);
