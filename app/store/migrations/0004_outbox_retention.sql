-- Outbox retention: published rows older than a retention period may be archived and deleted, by a role
-- of their own, and never an unpublished one. The relay's role still deletes nothing, and every other
-- change to the outbox is still refused by tr_outbox_insert_only, for the owner too.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_retention') THEN
        CREATE ROLE exports_retention NOLOGIN;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION refuse_outbox_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.message_id, NEW.kind, NEW.job_id, NEW.created_at)
           IS NOT DISTINCT FROM (OLD.message_id, OLD.kind, OLD.job_id, OLD.created_at) THEN
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

GRANT SELECT, DELETE ON outbox TO exports_retention;
