-- An operator may send again what the notifier gave up (dead): the delivery becomes pending once more,
-- under the same id (the receiver deduplicates on it), and its give-up horizon counts from the
-- redelivery instead of the outcome. Who did it, and when, stays on the row.
ALTER TABLE webhook_deliveries ADD COLUMN revived_at timestamptz;
ALTER TABLE webhook_deliveries ADD COLUMN revived_by text;
GRANT UPDATE (state, next_attempt_at, finished_at, revived_at, revived_by) ON webhook_deliveries TO exports_app;
