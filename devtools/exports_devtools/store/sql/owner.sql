-- Test equipment's statements (the demo's), run as the database owner: never by the product.

-- name: owner_lock_contacts
-- Held in an open transaction, it makes a build wait on its first read of contacts, where a slow
-- query would wait, until the transaction ends.
LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE;

-- name: owner_builds_waiting_on_lock
-- Builds of this database waiting on a lock. Only a session of the same user sees another's
-- wait_event_type, so this runs as the owner the processes log in as.
SELECT count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'exports-builder' AND wait_event_type = 'Lock';

-- name: owner_earlier_demo_databases
-- The databases of earlier demos on this server, all but the current one.
SELECT datname
FROM pg_database
WHERE datname LIKE 'demo\_%%' AND datname <> %(current)s
ORDER BY datname;

-- name: owner_attempt_owner
-- The worker that claimed an attempt (hostname:pid:thread) and the job's status now: the chaos soak
-- kills the process that owns a job at a chosen point.
SELECT id AS job_id, claimed_by, status
FROM export_jobs
WHERE attempt_id = %(attempt_id)s;

-- name: owner_terminate_sessions
-- Ends the sessions of this database opened under the given application names (the workers'
-- pools), as an administrator's pg_terminate_backend would. Returns one row per session ended.
SELECT pid, application_name, pg_terminate_backend(pid) AS terminated
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = ANY(%(names)s);

-- name: owner_terminate_database
-- Ends every other session of this database: what a server restart does to its clients, where the
-- server itself cannot be restarted.
SELECT pid, application_name, pg_terminate_backend(pid) AS terminated
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend';
