-- Issue 19: creates that can be retried, exports on a schedule, and incremental exports.

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

-- An export made by a schedule records it and its slot (a replacement carries them on); an incremental
-- one sends the contacts changed since incremental_since, the snapshot the schedule's last Completed run
-- built from (NULL: its first, a full one), and records at cutoff 2 the snapshot its own build read.
ALTER TABLE export_jobs ADD COLUMN schedule_id uuid;
ALTER TABLE export_jobs ADD COLUMN schedule_slot timestamp;
ALTER TABLE export_jobs ADD COLUMN incremental boolean NOT NULL DEFAULT false;
ALTER TABLE export_jobs ADD COLUMN incremental_since pg_snapshot;
ALTER TABLE export_jobs ADD COLUMN expected_snapshot pg_snapshot;
ALTER TABLE export_jobs
    ADD CONSTRAINT ck_export_jobs_schedule CHECK ((schedule_id IS NULL) = (schedule_slot IS NULL)),
    ADD CONSTRAINT ck_export_jobs_incremental CHECK (incremental OR incremental_since IS NULL),
    ADD CONSTRAINT fk_export_jobs_schedule FOREIGN KEY (tenant_id, schedule_id) REFERENCES schedules (tenant_id, id),
    ADD CONSTRAINT fk_export_jobs_slot FOREIGN KEY (schedule_id, schedule_slot)
        REFERENCES schedule_runs (schedule_id, slot) DEFERRABLE INITIALLY DEFERRED;
-- One original export per slot, whatever inserts it.
CREATE UNIQUE INDEX uq_export_jobs_slot ON export_jobs (schedule_id, schedule_slot)
    WHERE schedule_id IS NOT NULL AND replaces_job_id IS NULL;
-- A schedule's exports: whether one holds the next run, and the last Completed one's snapshot.
CREATE INDEX ix_export_jobs_schedule ON export_jobs (schedule_id, created_at) WHERE schedule_id IS NOT NULL;

-- Contacts' change tracking, kept by the database whoever writes them: the transaction that wrote each
-- contact last (an incremental export sends those its last Completed run's snapshot could not see), and
-- when its consent was withdrawn (a contact that withdrew is sent once more, marked for deletion).
-- Existing contacts count as written by this migration.
ALTER TABLE contacts ADD COLUMN changed_xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE contacts ADD COLUMN consent_withdrawn_at timestamptz;
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

GRANT SELECT, INSERT ON create_requests TO exports_app;
GRANT SELECT, INSERT ON schedules TO exports_app;
GRANT UPDATE (state, next_fire_at, changed_by, changed_at) ON schedules TO exports_app;
GRANT SELECT, INSERT ON schedule_runs TO exports_app;
GRANT UPDATE (outcome, job_id, detail, decided_at) ON schedule_runs TO exports_app;
