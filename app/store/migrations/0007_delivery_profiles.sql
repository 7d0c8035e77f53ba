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
CREATE TRIGGER tr_delivery_profiles_append_only BEFORE UPDATE OR DELETE ON delivery_profiles
    FOR EACH ROW EXECUTE FUNCTION refuse_history_change();
CREATE TRIGGER tr_delivery_profiles_no_truncate BEFORE TRUNCATE ON delivery_profiles
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change();

-- The destination's current profile, and the last file sequence number a created export took.
ALTER TABLE destinations ADD COLUMN profile_version int NOT NULL DEFAULT 1;
ALTER TABLE destinations ADD COLUMN file_sequence bigint NOT NULL DEFAULT 0;
-- Further known_hosts lines the server may present instead of host_key, while a partner rotates its key.
ALTER TABLE destinations ADD COLUMN more_host_keys text[] NOT NULL DEFAULT '{}';

-- Every destination so far delivered the one file there was: that file, written out, is version 1.
INSERT INTO delivery_profiles (destination_id, version, profile, created_by)
SELECT id, 1, '{"columns": [{"source": "email", "header": "email"}, {"source": "full_name", "header": "full_name"},
                            {"source": "company", "header": "company"}, {"source": "phone", "header": "phone"}],
                "format": "csv", "delimiter": ",", "quoting": "minimal", "header": true, "line_ending": "lf",
                "bom": false, "neutralize_formulas": false, "compression": "none",
                "file_name": "contacts-{delivery_key}.csv", "time_zone": "UTC"}'::jsonb, 'migration 0007'
FROM destinations;

-- A destination's current version exists: the statement that writes one writes the other.
ALTER TABLE destinations
    ADD CONSTRAINT fk_destinations_profile FOREIGN KEY (id, profile_version)
        REFERENCES delivery_profiles (destination_id, version) DEFERRABLE INITIALLY DEFERRED;

-- The partner-facing file name, rendered from the profile when the original was created and kept with its
-- delivery key, so a replacement delivers under the same name. Until now it was contacts-<key>.csv; the
-- append-only trigger is lifted for this one fill, in this transaction.
ALTER TABLE deliveries ADD COLUMN file_name text;
ALTER TABLE deliveries DISABLE TRIGGER tr_deliveries_append_only;
UPDATE deliveries SET file_name = 'contacts-' || delivery_key || '.csv';
ALTER TABLE deliveries ENABLE TRIGGER tr_deliveries_append_only;
ALTER TABLE deliveries ALTER COLUMN file_name SET NOT NULL;
ALTER TABLE deliveries ADD CONSTRAINT ck_deliveries_file_name CHECK (length(file_name) BETWEEN 1 AND 255);

-- Which profile version the attempt that reached cutoff 2 built its file with, and the completion marker
-- it writes after the file (its name and whole content; NULL without one), all recorded at cutoff 2.
ALTER TABLE export_jobs ADD COLUMN expected_profile_version int;
ALTER TABLE export_jobs ADD COLUMN expected_marker_name text;
ALTER TABLE export_jobs ADD COLUMN expected_marker bytea;

GRANT SELECT, INSERT ON delivery_profiles TO exports_app;
GRANT UPDATE (profile_version, file_sequence, host_key, more_host_keys) ON destinations TO exports_app;
