-- What a new export's file name is rendered from, read and taken inside the transaction that creates it
-- (app.delivery.naming renders it; export_create keeps it with the delivery key).

-- name: naming_read
-- What an export's file name is rendered from when it is created: the destination's current profile, the
-- tenant's name and the database's clock; nothing when the destination is not the tenant's. No lock: an
-- edit that commits before the create only means the name came from the version current a moment before
-- (the build uses the version current when it runs; cutoff 2 records which).
SELECT p.profile, p.version AS profile_version, t.name AS tenant_name, clock_timestamp() AS created_at
FROM destinations d
JOIN tenants t ON t.id = d.tenant_id
JOIN delivery_profiles p ON p.destination_id = d.id AND p.version = d.profile_version
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s;

-- name: naming_take_sequence
-- The next {sequence} of the destination's file names, inside the creating transaction: a create that
-- rolls back gives its number back, and concurrent creates take turns on the destination's row.
UPDATE destinations SET file_sequence = file_sequence + 1
WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s
RETURNING file_sequence;
