-- Partners as they are: how a delivery publishes a file on each destination's server (a delivery mode
-- for servers that refuse stat or rename, or whose ingestion takes a file the moment it appears; see
-- app/delivery/modes.py), the partner's bandwidth limit, and the mode each attempt delivered in,
-- recorded at cutoff 2 with the file, so recovery and reconciliation judge it by the rules it followed.
ALTER TABLE destinations ADD COLUMN delivery_mode text NOT NULL DEFAULT 'standard'
    CONSTRAINT ck_destinations_delivery_mode
        CHECK (delivery_mode IN ('standard', 'no-stat', 'no-rename', 'quick-ingest'));
ALTER TABLE destinations ADD COLUMN bandwidth_limit bigint
    CONSTRAINT ck_destinations_bandwidth_limit CHECK (bandwidth_limit BETWEEN 1024 AND 1000000000000);
ALTER TABLE export_jobs ADD COLUMN expected_delivery_mode text;

GRANT UPDATE (delivery_mode, bandwidth_limit) ON destinations TO exports_app;
