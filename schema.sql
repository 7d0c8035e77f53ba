-- The exports schema as it is now: the reference design's five tables (its columns exactly, ours after
-- them), the tables it leaves to the application (tenants, destinations and their circuits, contacts,
-- operator_access), the processes' heartbeats, the tenants' webhooks, the five roles and their grants,
-- and the triggers that make history append-only even for the owner.
--
-- `exports db migrate` applies this file to a new database, inside one transaction under an advisory
-- lock, and it records the version it is (the last line). A database made by an earlier release is
-- brought here by the numbered migrations in app/store/migrations/ instead, from 0001_initial.sql (the
-- first release's schema) on: a change to this file is also a new migration, and a test proves that
-- 0001 plus every migration dumps the same schema as this file.

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
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_retention') THEN
        CREATE ROLE exports_retention NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_notifier') THEN
        CREATE ROLE exports_notifier NOLOGIN;
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
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Paused: its queued exports wait unclaimed until a resume wakes them (who, why, since when).
    paused_by      text,
    paused_reason  text,
    paused_at      timestamptz,
    CONSTRAINT ck_tenants_paused CHECK ((paused_at IS NULL) = (paused_by IS NULL))
);

-- A destination holds a *reference* to its credential (an environment variable or a key file
-- path), never the secret, the partner's contract capabilities the evidence rules depend on, and the
-- partner's limits and the retry policy (many partners allow two or three sessions).
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
    max_sessions            int NOT NULL DEFAULT 4 CHECK (max_sessions BETWEEN 1 AND 64),
    auto_retries            int NOT NULL DEFAULT 3 CHECK (auto_retries BETWEEN 0 AND 20),   -- 0: off
    profile_version         int NOT NULL DEFAULT 1,       -- the current delivery profile (delivery_profiles)
    file_sequence           bigint NOT NULL DEFAULT 0,    -- the last {sequence} a created export's file name took
    more_host_keys          text[] NOT NULL DEFAULT '{}', -- further pinned known_hosts lines (a key rotation)
    -- How a delivery publishes a file on this partner's server (app/delivery/modes.py), and the partner's
    -- bandwidth limit for uploads in bytes per second (NULL: none).
    delivery_mode           text NOT NULL DEFAULT 'standard' CONSTRAINT ck_destinations_delivery_mode
                                CHECK (delivery_mode IN ('standard', 'no-stat', 'no-rename', 'quick-ingest')),
    bandwidth_limit         bigint CONSTRAINT ck_destinations_bandwidth_limit
                                CHECK (bandwidth_limit BETWEEN 1024 AND 1000000000000),
    -- Paused: its queued exports wait unclaimed until a resume wakes them; draining: the same, while the
    -- attempts already running finish, then paused. Who, why and since when.
    pause_state             text CONSTRAINT ck_destinations_pause_state CHECK (pause_state IN ('draining', 'paused')),
    paused_by               text,
    paused_reason           text,
    paused_at               timestamptz,
    CONSTRAINT uq_destinations_tenant UNIQUE (tenant_id, id),
    CONSTRAINT ck_destinations_paused
        CHECK ((pause_state IS NULL) = (paused_by IS NULL) AND (pause_state IS NULL) = (paused_at IS NULL))
);

-- What the partner receives, per destination: its delivery profile (columns, format, compression, file
-- name), one immutable version per change, so the version an attempt built with is on record for good.
CREATE TABLE delivery_profiles (
    destination_id  uuid NOT NULL REFERENCES destinations (id),
    version         int  NOT NULL CHECK (version >= 1),
    profile         jsonb NOT NULL CONSTRAINT ck_delivery_profiles_object CHECK (jsonb_typeof(profile) = 'object'),
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_delivery_profiles PRIMARY KEY (destination_id, version)
);

-- A destination's current version exists: the statement that writes one writes the other.
ALTER TABLE destinations
    ADD CONSTRAINT fk_destinations_profile FOREIGN KEY (id, profile_version)
        REFERENCES delivery_profiles (destination_id, version) DEFERRABLE INITIALLY DEFERRED;

-- What administrators changed on a tenant or a destination, and who, and why: pauses, drains, resumes,
-- a credential reference or the partner's contract flags. Append-only (triggers below).
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

-- One circuit per destination, shared by every worker host. Open after a connection failure: attempts
-- defer without building until next_probe_at, when one attempt claims the probe (probe_attempt_id,
-- until probe_until) and tries; a connection closes the circuit, a failed probe reopens it.
CREATE TABLE destination_circuits (
    destination_id    uuid PRIMARY KEY REFERENCES destinations (id),
    state             text NOT NULL CHECK (state IN ('closed', 'open')),
    opened_at         timestamptz,
    next_probe_at     timestamptz,
    probe_attempt_id  uuid,
    probe_until       timestamptz,
    failures          int  NOT NULL DEFAULT 0,         -- consecutive connection failures
    last_error        text,                            -- a secret-free description of the last one
    updated_at        timestamptz NOT NULL,
    CONSTRAINT ck_destination_circuits_open CHECK ((state = 'open') = (next_probe_at IS NOT NULL))
);

CREATE TABLE contacts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    email       text NOT NULL,
    full_name   text NOT NULL,
    company     text,
    phone       text,
    consent     boolean NOT NULL DEFAULT false,   -- the export policy only ships consenting contacts
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A tenant's custom fields (an imported file's extra columns, by header name); always an object.
    attributes  jsonb NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT ck_contacts_attributes_object CHECK (jsonb_typeof(attributes) = 'object'),
    -- Change tracking, kept by the database whoever writes (tr_contacts_track_change): the transaction
    -- that wrote the contact last (an incremental export sends those its last Completed run's snapshot
    -- could not see), and when its consent was withdrawn (sent once more, marked for deletion).
    changed_xid           xid8 NOT NULL DEFAULT pg_current_xact_id(),
    consent_withdrawn_at  timestamptz
);
CREATE INDEX ix_contacts_tenant ON contacts (tenant_id, id);
CREATE INDEX ix_contacts_changed ON contacts (tenant_id, changed_xid);

CREATE FUNCTION track_contact_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    NEW.updated_at := clock_timestamp();
    IF TG_OP = 'UPDATE' AND OLD.consent AND NOT NEW.consent THEN
        NEW.consent_withdrawn_at := clock_timestamp();
    ELSIF TG_OP = 'INSERT' THEN
        NEW.consent_withdrawn_at := NULL;
    ELSE
        NEW.consent_withdrawn_at := OLD.consent_withdrawn_at;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER tr_contacts_track_change BEFORE INSERT OR UPDATE ON contacts
    FOR EACH ROW EXECUTE FUNCTION track_contact_change();

-- A grant is live until revoked; a revoked one stays on record, and granting again makes a new row, so
-- every period of access is kept. At most one live row per operator and tenant.
CREATE TABLE operator_access (
    operator_id     text NOT NULL,
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    reconciliation  boolean NOT NULL DEFAULT false,   -- may correct recorded outcomes
    granted_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    id              bigint GENERATED ALWAYS AS IDENTITY CONSTRAINT pk_operator_access PRIMARY KEY,
    revoked_by      text,
    revoked_at      timestamptz,
    CONSTRAINT ck_operator_access_revoked CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);
CREATE UNIQUE INDEX uq_operator_access_live ON operator_access (operator_id, tenant_id) WHERE revoked_at IS NULL;

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

-- ---------------------------------------------------------------------------------------------
-- The reference design's five tables: its columns exactly, then the few we add, after them.
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
    delivery_key             text NOT NULL,             -- partner-facing identity; the final file name is kept with it
    replaces_job_id          uuid,                      -- set on a replacement job; always names the original
    created_by               text NOT NULL,             -- the operator or client that created the job
    replacement_reason       text,                      -- replacements only: why, in the creator's words
    overwrite_agreement_ref  text,                      -- replacements only: the partner's recorded overwrite agreement
    sweep_count              int  NOT NULL DEFAULT 0,   -- times the sweeper republished this job
    -- Ours. Filled by the default when export_create inserts the row: the operator views list the newest
    -- jobs first by it, and outbox rows may be archived away by retention anyway.
    created_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A job whose partner cannot be reached before cutoff 2 defers (goes back to Queued with a wake-up
    -- due after a backoff): how often (recovery's attempt cap counts attempt_count - deferrals), since
    -- when (the deferral budget counts from it), and the last cause.
    deferrals                int  NOT NULL DEFAULT 0,
    deferred_since           timestamptz,
    last_deferral            text,
    expected_profile_version int,                       -- recorded at cutoff 2: the profile the file was built with
    expected_marker_name     text,                      -- recorded at cutoff 2: the completion marker, if any,
    expected_marker          bytea,                     --   and its whole content
    -- An export made by a schedule records it and its slot (a replacement carries them on); an incremental
    -- one sends the contacts changed since incremental_since, the snapshot the schedule's last Completed
    -- run built from (NULL: its first, a full one), and records at cutoff 2 the snapshot its build read.
    schedule_id              uuid,
    schedule_slot            timestamp,
    incremental              boolean NOT NULL DEFAULT false,
    incremental_since        pg_snapshot,
    expected_snapshot        pg_snapshot,
    expected_delivery_mode   text,                      -- recorded at cutoff 2: how the file is published
    CONSTRAINT uq_export_jobs_tenant UNIQUE (tenant_id, id),
    CONSTRAINT ck_export_jobs_replacement CHECK ((replaces_job_id IS NULL) = (replacement_reason IS NULL)),
    CONSTRAINT ck_export_jobs_overwrite CHECK (overwrite_agreement_ref IS NULL OR replaces_job_id IS NOT NULL),
    CONSTRAINT ck_export_jobs_failure CHECK ((status = 'Failed') = (failure_reason IS NOT NULL)),
    CONSTRAINT ck_export_jobs_schedule CHECK ((schedule_id IS NULL) = (schedule_slot IS NULL)),
    CONSTRAINT ck_export_jobs_incremental CHECK (incremental OR incremental_since IS NULL)
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
    -- The partner-facing name, rendered from the profile when the original was created: a replacement
    -- delivers under it too.
    file_name        text NOT NULL CONSTRAINT ck_deliveries_file_name CHECK (length(file_name) BETWEEN 1 AND 255),
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
-- exports list and watch show the newest jobs first, of everyone, of a tenant, or in a state (sorting
-- by each job's first outbox row instead took 212 s at 100k jobs).
CREATE INDEX ix_export_jobs_created ON export_jobs (created_at);
CREATE INDEX ix_export_jobs_tenant_created ON export_jobs (tenant_id, created_at);
CREATE INDEX ix_export_jobs_status_created ON export_jobs (status, created_at);
-- Reconciliation pages through OutcomeUnknown jobs by id; they are few among many finished ones.
CREATE INDEX ix_export_jobs_outcome_unknown ON export_jobs (id) WHERE status = 'OutcomeUnknown';
-- The retry policy pages through recent proven non-deliveries, and looks at the other jobs of each one's
-- delivery key (the newest, and how many it already created).
CREATE INDEX ix_export_jobs_not_delivered ON export_jobs (created_at)
    WHERE status = 'Failed' AND failure_reason = 'NotDelivered';
CREATE INDEX ix_export_jobs_delivery_key ON export_jobs (tenant_id, delivery_key, created_at);
-- A schedule's exports: whether one holds the next run, and the last Completed one's snapshot.
CREATE INDEX ix_export_jobs_schedule ON export_jobs (schedule_id, created_at) WHERE schedule_id IS NOT NULL;

CREATE TABLE export_attempt_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES export_jobs (id),
    attempt_id   uuid NOT NULL,
    -- DeferredPartnerUnavailable: the deferral's event, Running -> Queued for this attempt, its cause
    -- in the detail.
    kind         text NOT NULL CHECK (kind IN ('Claimed', 'DeliveryAuthorized', 'Stopped', 'Failed',
                     'Finished', 'RequeuedByRecovery', 'StoppedByRecovery', 'AttemptsExhausted',
                     'ResolvedByRecovery', 'Reconciled', 'Corrected', 'DeliveryEvidence',
                     'DeferredPartnerUnavailable')),
    version      int,
    worker_id    text,
    observed_by  text,               -- for delivery evidence: the worker attempt or the recovery run
    detail       text,
    recorded_at  timestamptz NOT NULL
);

-- Each transition happens at most once per attempt; evidence may be appended many times.
CREATE UNIQUE INDEX uq_attempt_transition ON export_attempt_events (job_id, attempt_id, kind)
    WHERE kind <> 'DeliveryEvidence';

-- show reads one job's events, and recovery one attempt's delivery evidence (uq_attempt_transition
-- leaves DeliveryEvidence out, so it cannot serve that read).
CREATE INDEX ix_export_attempt_events_attempt ON export_attempt_events (job_id, attempt_id, id);

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

-- show reads one job's cancellation requests.
CREATE INDEX ix_cancellation_requests_job ON cancellation_requests (tenant_id, job_id);

CREATE TABLE outbox (
    message_id    uuid PRIMARY KEY,    -- a new ID for every row; reused only when the dispatcher retries this row
    kind          text NOT NULL,
    job_id        uuid NOT NULL,
    created_at    timestamptz NOT NULL,
    published_at  timestamptz,
    due_at        timestamptz          -- ours: a wake-up due later (a deferral's); NULL: due at once
);

-- The relay publishes a row once it is due, oldest due first.
CREATE INDEX ix_outbox_unpublished ON outbox ((coalesce(due_at, created_at))) WHERE published_at IS NULL;
-- show reads one job's outbox rows; retention pages through the oldest.
CREATE INDEX ix_outbox_job ON outbox (job_id, created_at);
CREATE INDEX ix_outbox_created ON outbox (created_at);

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
CREATE TRIGGER tr_contact_erasures_append_only BEFORE UPDATE OR DELETE ON contact_erasures
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_contact_erasures_no_truncate BEFORE TRUNCATE ON contact_erasures
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_deliveries_no_truncate BEFORE TRUNCATE ON deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_delivery_profiles_append_only BEFORE UPDATE OR DELETE ON delivery_profiles
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_delivery_profiles_no_truncate BEFORE TRUNCATE ON delivery_profiles
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_directory_events_append_only BEFORE UPDATE OR DELETE ON directory_events
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_directory_events_no_truncate BEFORE TRUNCATE ON directory_events
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- The outbox is insert-only apart from its publication status: an update may change published_at
-- alone (due_at is written once with the row, like the other columns), and the only deletion is
-- retention's, by a role of its own, of a published row: an unpublished row is a wake-up still owed.
-- The relay's role deletes nothing, and the owner is refused every other change too.
CREATE FUNCTION refuse_outbox_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.message_id, NEW.kind, NEW.job_id, NEW.created_at, NEW.due_at)
           IS NOT DISTINCT FROM (OLD.message_id, OLD.kind, OLD.job_id, OLD.created_at, OLD.due_at) THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' AND OLD.published_at IS NOT NULL
       AND pg_has_role(current_user, 'exports_retention', 'USAGE') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% on outbox is not allowed: only published_at may change, and only retention deletes a published row', TG_OP
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
-- Ours: creates that can be retried, and exports on a schedule.
-- ---------------------------------------------------------------------------------------------

-- A create or replace request, recorded with the export it made, in the same transaction: the same id
-- with the same terms answers that export again; with other terms it is refused (RequestIdReused). Bound
-- to the tenant and the operator like a cancellation request. Append-only.
CREATE TABLE create_requests (
    tenant_id                uuid NOT NULL,
    id                       uuid NOT NULL,        -- supplied by the client, once per submission
    kind                     text NOT NULL CONSTRAINT ck_create_requests_kind CHECK (kind IN ('Create', 'Replace')),
    job_id                   uuid NOT NULL,        -- the export it created
    requested_by             text NOT NULL,
    destination_id           uuid,                 -- a create's terms
    original_job_id          uuid,                 -- a replacement's terms: the original, and its overwrite agreement
    overwrite_agreement_ref  text,
    recorded_at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_create_requests PRIMARY KEY (tenant_id, id),
    CONSTRAINT ck_create_requests_terms CHECK ((kind = 'Create') = (destination_id IS NOT NULL)
                                               AND (kind = 'Replace') = (original_job_id IS NOT NULL)),
    -- The request is inserted before the export it makes (so a second submission of the same id waits on
    -- its key before doing any work): the key is checked at commit.
    CONSTRAINT fk_create_requests_job FOREIGN KEY (tenant_id, job_id)
        REFERENCES export_jobs (tenant_id, id) DEFERRABLE INITIALLY DEFERRED
);
CREATE TRIGGER tr_create_requests_append_only BEFORE UPDATE OR DELETE ON create_requests
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_create_requests_no_truncate BEFORE TRUNCATE ON create_requests
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- A tenant's export to a destination on a cron schedule, in a time zone. next_fire_at is the next fire
-- time (as APScheduler computed it) that no scheduler has decided yet: a scheduler moves it on only over
-- the value it read, in the transaction that records the slots it passed. Never deleted: removing a
-- schedule sets its state, and its runs and exports keep pointing at it.
CREATE TABLE schedules (
    id              uuid PRIMARY KEY,
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    destination_id  uuid NOT NULL,
    cron            text NOT NULL CONSTRAINT ck_schedules_cron CHECK (length(cron) BETWEEN 1 AND 200),
    time_zone       text NOT NULL CONSTRAINT ck_schedules_time_zone CHECK (length(time_zone) BETWEEN 1 AND 100),
    incremental     boolean NOT NULL DEFAULT false,
    state           text NOT NULL CONSTRAINT ck_schedules_state CHECK (state IN ('Active', 'Paused', 'Removed')),
    next_fire_at    timestamptz,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    changed_by      text NOT NULL,                 -- who added, paused, resumed or removed it last
    changed_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT uq_schedules_tenant UNIQUE (tenant_id, id),
    CONSTRAINT fk_schedules_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    -- Only an active schedule fires; an active one whose cron never fires again has none.
    CONSTRAINT ck_schedules_next_fire CHECK (state = 'Active' OR next_fire_at IS NULL)
);
-- The schedulers find the schedules due.
CREATE INDEX ix_schedules_due ON schedules (next_fire_at) WHERE state = 'Active';
CREATE INDEX ix_schedules_tenant ON schedules (tenant_id, created_at);
CREATE TRIGGER tr_schedules_no_delete BEFORE DELETE ON schedules
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_schedules_no_truncate BEFORE TRUNCATE ON schedules
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- One row per slot a scheduler decided: a slot is the local wall-clock time of a fire (in the schedule's
-- zone), so a 02:00 that occurs twice when clocks go back is one slot, run once. The primary key is what
-- makes a slot run at most once, however many schedulers run and however often they restart. Created:
-- its export was created in the same transaction. Missed: older than the grace when a scheduler got to
-- it, or folded into a later slot due at the same time. Held: an incremental schedule's earlier run was
-- not settled; it becomes Created once that run is (only Held ever changes).
CREATE TABLE schedule_runs (
    schedule_id  uuid NOT NULL REFERENCES schedules (id),
    slot         timestamp NOT NULL,
    fire_at      timestamptz NOT NULL,              -- the instant APScheduler computed (or run-now's)
    trigger      text NOT NULL CONSTRAINT ck_schedule_runs_trigger CHECK (trigger IN ('Cron', 'RunNow')),
    outcome      text NOT NULL CONSTRAINT ck_schedule_runs_outcome CHECK (outcome IN ('Created', 'Missed', 'Held')),
    job_id       uuid,
    detail       text,
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    decided_at   timestamptz NOT NULL DEFAULT clock_timestamp(),   -- when it became what it is
    CONSTRAINT pk_schedule_runs PRIMARY KEY (schedule_id, slot),
    CONSTRAINT uq_schedule_runs_job UNIQUE (job_id),
    CONSTRAINT ck_schedule_runs_job CHECK ((outcome = 'Created') = (job_id IS NOT NULL)),
    CONSTRAINT fk_schedule_runs_job FOREIGN KEY (job_id) REFERENCES export_jobs (id) DEFERRABLE INITIALLY DEFERRED
);
CREATE INDEX ix_schedule_runs_held ON schedule_runs (schedule_id) WHERE outcome = 'Held';

CREATE FUNCTION refuse_schedule_run_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.outcome = 'Held'
       AND (NEW.schedule_id, NEW.slot, NEW.fire_at, NEW.trigger, NEW.recorded_at)
           IS NOT DISTINCT FROM (OLD.schedule_id, OLD.slot, OLD.fire_at, OLD.trigger, OLD.recorded_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% on schedule_runs is not allowed: a decided slot stays decided; only a Held one changes', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER tr_schedule_runs_decided BEFORE UPDATE OR DELETE ON schedule_runs
    FOR EACH ROW EXECUTE FUNCTION refuse_schedule_run_change();
CREATE TRIGGER tr_schedule_runs_no_truncate BEFORE TRUNCATE ON schedule_runs
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- An export's slot is one of its schedule's decided slots, of its own tenant's schedule, and only an
-- original takes a slot (a replacement carries its original's on).
ALTER TABLE export_jobs
    ADD CONSTRAINT fk_export_jobs_schedule FOREIGN KEY (tenant_id, schedule_id) REFERENCES schedules (tenant_id, id),
    ADD CONSTRAINT fk_export_jobs_slot FOREIGN KEY (schedule_id, schedule_slot)
        REFERENCES schedule_runs (schedule_id, slot) DEFERRABLE INITIALLY DEFERRED;
CREATE UNIQUE INDEX uq_export_jobs_slot ON export_jobs (schedule_id, schedule_slot)
    WHERE schedule_id IS NOT NULL AND replaces_job_id IS NULL;

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
-- Each long-running process (relay, worker, scheduler) records that it is alive, for `exports health`,
-- `exports processes` and the metrics. The protocol never reads this table: a dead process is found
-- by its lease or its outbox, not by its heartbeat.
-- ---------------------------------------------------------------------------------------------

CREATE TABLE process_heartbeats (
    process_id   text PRIMARY KEY,               -- host:pid, the prefix of a worker's claimed_by
    role         text NOT NULL CHECK (role IN ('relay', 'worker', 'scheduler', 'notifier')),
    host         text NOT NULL,
    pid          int  NOT NULL,
    version      text NOT NULL,                  -- the exports release the process runs
    started_at   timestamptz NOT NULL,
    beat_at      timestamptz NOT NULL,
    stopped_at   timestamptz,                    -- set by a clean shutdown
    parent_pid   int                             -- a worker process's `exports worker`, the pid to signal
);

-- The scheduler's pruning finds the processes dead for long by their last beat.
CREATE INDEX ix_process_heartbeats_beat ON process_heartbeats (beat_at);

-- ---------------------------------------------------------------------------------------------
-- Webhooks: a tenant told what happened to its exports. Every statement that gives an export an outcome
-- (a terminal status, or OutcomeUnknown) inserts, in the same statement, one delivery per live endpoint
-- of the job's tenant: an outbox of its own, which the notifier process (exports_notifier) sends after
-- commit, with retries, recording each attempt. A tenant without an endpoint pays one index probe.
-- ---------------------------------------------------------------------------------------------

-- A tenant's endpoint: an HTTPS URL (plain http only where allow_http was asked for, for a loopback
-- receiver) and a *reference* to its signing secret (env:VAR or file:/path), never the secret. Removing
-- one keeps its row, since its deliveries name it; the notifier then drops what it still owed it.
CREATE TABLE webhook_endpoints (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    url         text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    allow_http  boolean NOT NULL DEFAULT false,
    secret_ref  text NOT NULL CONSTRAINT ck_webhook_endpoints_secret_ref CHECK (secret_ref ~ '^(env|file):.+$'),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    removed_by  text,
    removed_at  timestamptz,
    CONSTRAINT uq_webhook_endpoints_tenant UNIQUE (tenant_id, id),
    CONSTRAINT ck_webhook_endpoints_scheme CHECK (url ~ '^https://' OR (allow_http AND url ~ '^http://')),
    CONSTRAINT ck_webhook_endpoints_removed CHECK ((removed_at IS NULL) = (removed_by IS NULL))
);
-- A name names one live endpoint of its tenant; the outcome statements find a tenant's live endpoints
-- by its leading column.
CREATE UNIQUE INDEX uq_webhook_endpoints_live_name ON webhook_endpoints (tenant_id, name) WHERE removed_at IS NULL;

-- One event for one endpoint: what happened (written with the outcome, never changed: its id is the
-- webhook-id the receiver deduplicates on, the same on every retry), then the notifier's sending state
-- (pending until delivered, dead past the give-up horizon, dropped when the endpoint was removed). The
-- body is rendered from these columns and the job's facts fixed by then (its key, file name, bytes,
-- sha256), so every retry sends the same bytes.
CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id      uuid NOT NULL,
    tenant_id        uuid NOT NULL,
    job_id           uuid NOT NULL,                -- no key into export_jobs, like the outbox's: no check on its hot updates
    attempt_id       uuid,
    status           text NOT NULL CHECK (status IN ('Completed', 'Failed', 'Stopped', 'Canceled', 'Rejected',
                                                     'OutcomeUnknown')),
    failure_reason   text,
    source           text NOT NULL CHECK (source IN ('worker', 'recovery', 'reconciliation', 'correction',
                                                     'cancellation', 'policy')),
    occurred_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead', 'dropped')),
    attempts         int  NOT NULL DEFAULT 0,      -- claimed this often by a notifier
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),   -- due, or leased to a notifier until then
    finished_at      timestamptz,
    revived_at       timestamptz,                  -- sent again by an operator after it was given up: the
    revived_by       text,                         -- horizon counts from then (exports webhook redeliver)
    CONSTRAINT fk_webhook_deliveries_endpoint FOREIGN KEY (tenant_id, endpoint_id)
        REFERENCES webhook_endpoints (tenant_id, id),
    CONSTRAINT ck_webhook_deliveries_failure CHECK ((status = 'Failed') = (failure_reason IS NOT NULL)),
    CONSTRAINT ck_webhook_deliveries_finished CHECK ((state = 'pending') = (finished_at IS NULL))
);
-- The notifier pages through due deliveries; show reads a job's; webhook show an endpoint's newest;
-- health and the metrics count the dead.
CREATE INDEX ix_webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX ix_webhook_deliveries_job ON webhook_deliveries (job_id);
CREATE INDEX ix_webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, occurred_at);
CREATE INDEX ix_webhook_deliveries_dead ON webhook_deliveries (endpoint_id, finished_at) WHERE state = 'dead';
-- The notifier takes one delivery per endpoint at a time: each endpoint's next (its failing one first, then
-- the oldest) by this index.
CREATE INDEX ix_webhook_deliveries_endpoint_turn ON webhook_deliveries (endpoint_id, attempts DESC, next_attempt_at, id)
    WHERE state = 'pending';
ALTER TABLE webhook_deliveries SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000,
                                    autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);

-- Every request a notifier made, once per claim: the receiver's HTTP status, or why none came.
CREATE TABLE webhook_attempts (
    delivery_id  uuid NOT NULL REFERENCES webhook_deliveries (id),
    attempt      int  NOT NULL CHECK (attempt >= 1),
    sender       text NOT NULL,                    -- host:pid of the notifier
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    http_status  int,
    error        text,                             -- secret-free: a timeout, a refused connection, HTTP 503...
    CONSTRAINT pk_webhook_attempts PRIMARY KEY (delivery_id, attempt)
);

-- A delivery's event never changes and no delivery is deleted; only the sending state moves.
CREATE FUNCTION refuse_webhook_delivery_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.id, NEW.endpoint_id, NEW.tenant_id, NEW.job_id, NEW.attempt_id, NEW.status, NEW.failure_reason,
            NEW.source, NEW.occurred_at)
           IS NOT DISTINCT FROM (OLD.id, OLD.endpoint_id, OLD.tenant_id, OLD.job_id, OLD.attempt_id, OLD.status,
                                 OLD.failure_reason, OLD.source, OLD.occurred_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% on webhook_deliveries is not allowed: only the sending state may change', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER tr_webhook_deliveries_event_only BEFORE UPDATE OR DELETE ON webhook_deliveries
    FOR EACH ROW EXECUTE FUNCTION refuse_webhook_delivery_change();
CREATE TRIGGER tr_webhook_deliveries_no_truncate BEFORE TRUNCATE ON webhook_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_webhook_delivery_change();
CREATE TRIGGER tr_webhook_attempts_append_only BEFORE UPDATE OR DELETE ON webhook_attempts
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_webhook_attempts_no_truncate BEFORE TRUNCATE ON webhook_attempts
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- ---------------------------------------------------------------------------------------------
-- Grants. Every process connects under one of these roles, so a missing or excess grant fails a test.
-- ---------------------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;

-- exports_app: the API, the worker, recovery, the sweeper and the operator scripts.
GRANT SELECT, INSERT ON tenants, destinations, contacts, operator_access TO exports_app;
GRANT UPDATE (active, profile_version, file_sequence, host_key, more_host_keys, delivery_mode, bandwidth_limit,
              credential_ref, remote_hash, acknowledgments, name_and_size_identify, read_back, pause_state,
              paused_by, paused_reason, paused_at)
    ON destinations TO exports_app;
GRANT UPDATE (paused_by, paused_reason, paused_at) ON tenants TO exports_app;
GRANT UPDATE (max_sessions) ON destinations TO exports_app;
GRANT UPDATE (revoked_by, revoked_at) ON operator_access TO exports_app;
GRANT DELETE ON contacts TO exports_app;
GRANT SELECT, INSERT ON contact_erasures TO exports_app;
GRANT SELECT, INSERT ON directory_events TO exports_app;
GRANT SELECT, INSERT ON delivery_profiles TO exports_app;
GRANT SELECT, INSERT, UPDATE ON export_jobs TO exports_app;
GRANT SELECT, INSERT ON deliveries, export_attempt_events, cancellation_requests TO exports_app;
GRANT SELECT, INSERT ON outbox TO exports_app;
GRANT SELECT ON schema_version TO exports_app;
GRANT SELECT, INSERT, UPDATE ON destination_circuits TO exports_app;
GRANT SELECT, INSERT ON create_requests TO exports_app;
GRANT SELECT, INSERT ON schedules TO exports_app;
GRANT UPDATE (state, next_fire_at, changed_by, changed_at) ON schedules TO exports_app;
GRANT SELECT, INSERT ON schedule_runs TO exports_app;
GRANT UPDATE (outcome, job_id, detail, decided_at) ON schedule_runs TO exports_app;

-- exports_dispatcher: the relay reads the outbox and marks publication, nothing more; of a job it reads
-- the id and the tenant, which its line per published wake-up names.
GRANT SELECT ON outbox TO exports_dispatcher;
GRANT UPDATE (published_at) ON outbox TO exports_dispatcher;
GRANT SELECT (id, tenant_id) ON export_jobs TO exports_dispatcher;

-- exports_reconciler: corrections of recorded outcomes, with their event.
GRANT SELECT ON export_jobs, export_attempt_events, tenants, operator_access TO exports_reconciler;
GRANT UPDATE (status, failure_reason) ON export_jobs TO exports_reconciler;
GRANT INSERT ON export_attempt_events TO exports_reconciler;

-- exports_retention: `exports outbox archive` deletes published outbox rows past their retention
-- (the outbox trigger refuses it an unpublished one).
GRANT SELECT, DELETE ON outbox TO exports_retention;

-- Heartbeats: every process beats, the relay as exports_dispatcher; the scheduler, as exports_app,
-- prunes the processes dead for longer than the retention (heartbeat_prune), and nothing else deletes.
GRANT SELECT, INSERT, UPDATE (beat_at, stopped_at, version, started_at, role, host, pid, parent_pid)
    ON process_heartbeats TO exports_app, exports_dispatcher, exports_notifier;
GRANT DELETE ON process_heartbeats TO exports_app;

-- Webhooks. The application's role registers and removes endpoints and, with every outcome, inserts the
-- deliveries; so does the reconciler's, with a correction. The notifier reads what it sends (the job's
-- facts a body needs, column by column), moves the sending state and records attempts, nothing else.
GRANT SELECT, INSERT ON webhook_endpoints TO exports_app;
GRANT UPDATE (removed_by, removed_at) ON webhook_endpoints TO exports_app;
GRANT SELECT, INSERT ON webhook_deliveries TO exports_app;
GRANT SELECT ON webhook_attempts TO exports_app;
GRANT SELECT ON webhook_endpoints TO exports_reconciler;
GRANT INSERT ON webhook_deliveries TO exports_reconciler;
GRANT SELECT ON webhook_endpoints TO exports_notifier;
GRANT SELECT, UPDATE (state, attempts, next_attempt_at, finished_at) ON webhook_deliveries TO exports_notifier;
GRANT UPDATE (state, next_attempt_at, finished_at, revived_at, revived_by) ON webhook_deliveries TO exports_app;
GRANT SELECT, INSERT ON webhook_attempts TO exports_notifier;
GRANT SELECT (id, tenant_id, delivery_key, attempt_count, expected_file_bytes, expected_file_sha256,
              replaces_job_id) ON export_jobs TO exports_notifier;
GRANT SELECT (tenant_id, delivery_key, file_name) ON deliveries TO exports_notifier;

-- The version this file is: the number of the last migration in app/store/migrations/.
INSERT INTO schema_version (version) VALUES (16);
