-- Transient failures are not final: a job whose partner cannot be reached before cutoff 2 goes back to
-- Queued with a wake-up due after a backoff, instead of failing; a circuit per destination keeps an
-- outage from costing a build per job; a destination bounds the sessions open to it; a proven
-- non-delivery of a transient cause may be retried automatically.

-- The deferral's event: Running -> Queued for this attempt, with its cause in the detail.
ALTER TABLE export_attempt_events DROP CONSTRAINT export_attempt_events_kind_check,
    ADD CONSTRAINT export_attempt_events_kind_check CHECK (kind IN ('Claimed', 'DeliveryAuthorized', 'Stopped',
        'Failed', 'Finished', 'RequeuedByRecovery', 'StoppedByRecovery', 'AttemptsExhausted', 'ResolvedByRecovery',
        'Reconciled', 'Corrected', 'DeliveryEvidence', 'DeferredPartnerUnavailable'));

-- How often the job was deferred (recovery's attempt cap counts attempt_count - deferrals), since when
-- (the deferral budget counts from it), and the last cause.
ALTER TABLE export_jobs
    ADD COLUMN deferrals       int NOT NULL DEFAULT 0,
    ADD COLUMN deferred_since  timestamptz,
    ADD COLUMN last_deferral   text;

-- A wake-up due later (NULL: due at once). The relay publishes a row once it is due, oldest due first.
ALTER TABLE outbox ADD COLUMN due_at timestamptz;
DROP INDEX ix_outbox_unpublished;
CREATE INDEX ix_outbox_unpublished ON outbox ((coalesce(due_at, created_at))) WHERE published_at IS NULL;

-- due_at is written once with the row, like the other columns: only published_at may change.
CREATE OR REPLACE FUNCTION refuse_outbox_change() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- The partner's limits and the retry policy, per destination. Many partners allow two or three sessions.
ALTER TABLE destinations
    ADD COLUMN max_sessions  int NOT NULL DEFAULT 4 CHECK (max_sessions BETWEEN 1 AND 64),
    ADD COLUMN auto_retries  int NOT NULL DEFAULT 3 CHECK (auto_retries BETWEEN 0 AND 20);   -- 0: off

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

GRANT SELECT, INSERT, UPDATE ON destination_circuits TO exports_app;

-- The retry policy pages through recent proven non-deliveries, and looks at the other jobs of each one's
-- delivery key (the newest, and how many it already created).
CREATE INDEX ix_export_jobs_not_delivered ON export_jobs (created_at)
    WHERE status = 'Failed' AND failure_reason = 'NotDelivered';
CREATE INDEX ix_export_jobs_delivery_key ON export_jobs (tenant_id, delivery_key, created_at);
