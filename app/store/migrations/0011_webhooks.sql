-- Webhooks: a tenant told what happened to its exports. A tenant registers endpoints (an HTTPS URL and a
-- *reference* to its signing secret); every statement that gives an export an outcome inserts, in the same
-- statement, one delivery per live endpoint of the job's tenant; the notifier process (its own role) sends
-- them after commit and records each attempt. Deliveries and attempts are history: append-only by grants
-- and triggers, apart from a delivery's sending state.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_notifier') THEN
        CREATE ROLE exports_notifier NOLOGIN;
    END IF;
END
$$;

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
CREATE UNIQUE INDEX uq_webhook_endpoints_live_name ON webhook_endpoints (tenant_id, name) WHERE removed_at IS NULL;

CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id      uuid NOT NULL,
    tenant_id        uuid NOT NULL,
    job_id           uuid NOT NULL,
    attempt_id       uuid,
    status           text NOT NULL CHECK (status IN ('Completed', 'Failed', 'Stopped', 'Canceled', 'Rejected',
                                                     'OutcomeUnknown')),
    failure_reason   text,
    source           text NOT NULL CHECK (source IN ('worker', 'recovery', 'reconciliation', 'correction',
                                                     'cancellation', 'policy')),
    occurred_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead', 'dropped')),
    attempts         int  NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at      timestamptz,
    CONSTRAINT fk_webhook_deliveries_endpoint FOREIGN KEY (tenant_id, endpoint_id)
        REFERENCES webhook_endpoints (tenant_id, id),
    CONSTRAINT ck_webhook_deliveries_failure CHECK ((status = 'Failed') = (failure_reason IS NOT NULL)),
    CONSTRAINT ck_webhook_deliveries_finished CHECK ((state = 'pending') = (finished_at IS NULL))
);
CREATE INDEX ix_webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX ix_webhook_deliveries_job ON webhook_deliveries (job_id);
CREATE INDEX ix_webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, occurred_at);
CREATE INDEX ix_webhook_deliveries_dead ON webhook_deliveries (endpoint_id, finished_at) WHERE state = 'dead';
ALTER TABLE webhook_deliveries SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000,
                                    autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);

CREATE TABLE webhook_attempts (
    delivery_id  uuid NOT NULL REFERENCES webhook_deliveries (id),
    attempt      int  NOT NULL CHECK (attempt >= 1),
    sender       text NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    http_status  int,
    error        text,
    CONSTRAINT pk_webhook_attempts PRIMARY KEY (delivery_id, attempt)
);

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

-- The notifier beats like the other processes.
ALTER TABLE process_heartbeats DROP CONSTRAINT process_heartbeats_role_check;
ALTER TABLE process_heartbeats ADD CONSTRAINT process_heartbeats_role_check
    CHECK (role IN ('relay', 'worker', 'scheduler', 'notifier'));

GRANT SELECT, INSERT ON webhook_endpoints TO exports_app;
GRANT UPDATE (removed_by, removed_at) ON webhook_endpoints TO exports_app;
GRANT SELECT, INSERT ON webhook_deliveries TO exports_app;
GRANT SELECT ON webhook_attempts TO exports_app;
GRANT SELECT ON webhook_endpoints TO exports_reconciler;
GRANT INSERT ON webhook_deliveries TO exports_reconciler;
GRANT SELECT ON webhook_endpoints TO exports_notifier;
GRANT SELECT, UPDATE (state, attempts, next_attempt_at, finished_at) ON webhook_deliveries TO exports_notifier;
GRANT SELECT, INSERT ON webhook_attempts TO exports_notifier;
GRANT SELECT (id, tenant_id, delivery_key, attempt_count, expected_file_bytes, expected_file_sha256,
              replaces_job_id) ON export_jobs TO exports_notifier;
GRANT SELECT (tenant_id, delivery_key, file_name) ON deliveries TO exports_notifier;
GRANT SELECT, INSERT, UPDATE (beat_at, stopped_at, version, started_at, role, host, pid)
    ON process_heartbeats TO exports_notifier;
