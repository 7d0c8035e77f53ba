-- The relay names the tenant of each wake-up it publishes in its log line, so one export can be followed
-- by tenant_id through every process (issue 20): it may read a job's id and tenant, nothing else of it.
GRANT SELECT (id, tenant_id) ON export_jobs TO exports_dispatcher;
