-- Recording a create or replace request with the export it made, in the same transaction: one lookup,
-- one insert (which takes the request id's key before any other work, so a second submission of the same
-- id waits there), then the export's own statements.

-- name: creation_find_request
-- A committed request of this tenant, with what its export delivers under (the export always exists: the
-- two commit together).
SELECT r.tenant_id, r.id, r.kind, r.job_id, r.requested_by, r.destination_id, r.original_job_id,
       r.overwrite_agreement_ref, r.recorded_at, j.delivery_key, k.file_name, j.status
FROM create_requests r
JOIN export_jobs j ON j.tenant_id = r.tenant_id AND j.id = r.job_id
JOIN deliveries k ON k.tenant_id = j.tenant_id AND k.delivery_key = j.delivery_key
WHERE r.tenant_id = %(tenant_id)s AND r.id = %(request_id)s;

-- name: creation_record_request
-- The request, bound to the tenant, the operator and its terms, naming the export the same transaction
-- creates next (its key is checked at commit).
INSERT INTO create_requests (tenant_id, id, kind, job_id, requested_by, destination_id, original_job_id,
                             overwrite_agreement_ref)
VALUES (%(tenant_id)s, %(request_id)s, %(kind)s, %(job_id)s, %(requested_by)s, %(destination_id)s,
        %(original_job_id)s, %(overwrite_agreement_ref)s)
RETURNING recorded_at;

-- name: creation_read_delivery
-- What an export created in this transaction delivers under: its key and the key's file name.
SELECT j.delivery_key, k.file_name
FROM export_jobs j
JOIN deliveries k ON k.tenant_id = j.tenant_id AND k.delivery_key = j.delivery_key
WHERE j.tenant_id = %(tenant_id)s AND j.id = %(job_id)s;
