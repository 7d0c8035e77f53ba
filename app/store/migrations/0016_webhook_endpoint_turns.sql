-- One request at a time per endpoint, and an endpoint that failed rests until its failing delivery's retry
-- (sql/webhooks.sql, webhooks_claim_batch): a slow or dead receiver holds one notifier thread for one
-- timeout per rest, never every thread for a timeout per event, so other tenants' events keep flowing.
-- The claim finds each endpoint's next delivery (its failing one first, then the oldest) by this index.
CREATE INDEX ix_webhook_deliveries_endpoint_turn ON webhook_deliveries (endpoint_id, attempts DESC, next_attempt_at, id)
    WHERE state = 'pending';
