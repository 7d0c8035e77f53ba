-- A contact's erasure (GDPR): the tenant's contacts of one address deleted, the erasure recorded without
-- the address, and what can be known of where the address went before.

-- name: erasure_find
-- The tenant's contacts of the address (compared case-insensitively, as mail systems do), and whether any
-- ever consented: the builder ships consenting contacts only (and, in an incremental export, a withdrawn
-- consent once more, marked for deletion), so one that never consented was never in a file.
SELECT count(*) AS contacts, coalesce(bool_or(consent OR consent_withdrawn_at IS NOT NULL), false) AS ever_consented
FROM contacts
WHERE tenant_id = %(tenant_id)s AND lower(email) = lower(%(email)s);

-- name: erasure_exposure
-- Where the tenant's files went, by destination: exports delivered (Completed; first and last by their
-- cutoff 2), undetermined (OutcomeUnknown: a file may be there), and in flight now (a build under way read
-- its contacts at its start, so it may still carry an address erased since). Files record no rows, so
-- which of them held an address cannot be known: these are where it may be.
SELECT d.id AS destination_id, d.name AS destination, d.host,
       count(*) FILTER (WHERE j.status = 'Completed') AS delivered,
       min(j.delivery_authorized_at) FILTER (WHERE j.status = 'Completed') AS first_delivered,
       max(j.delivery_authorized_at) FILTER (WHERE j.status = 'Completed') AS last_delivered,
       count(*) FILTER (WHERE j.status = 'OutcomeUnknown') AS undetermined,
       count(*) FILTER (WHERE j.status IN ('Running', 'Delivering')) AS in_flight
FROM export_jobs j
JOIN destinations d ON d.tenant_id = j.tenant_id AND d.id = j.destination_id
WHERE j.tenant_id = %(tenant_id)s AND j.status IN ('Completed', 'OutcomeUnknown', 'Running', 'Delivering')
GROUP BY d.id, d.name, d.host
ORDER BY d.name, d.id;

-- name: erasure_erase
-- Deletes the contacts and records the erasure in one statement: both or neither. Nothing is recorded
-- when no contact matched (an erasure already done, or an address never there).
WITH gone AS (
    DELETE FROM contacts WHERE tenant_id = %(tenant_id)s AND lower(email) = lower(%(email)s)
    RETURNING id)
INSERT INTO contact_erasures (tenant_id, erased_by, reason, contacts_erased)
SELECT %(tenant_id)s, %(erased_by)s, %(reason)s, count(*) FROM gone HAVING count(*) > 0
RETURNING id, contacts_erased, recorded_at;
