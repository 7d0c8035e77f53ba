-- Test equipment's statements (the demo's), run as the database owner: never by the product.

-- name: devtools_lock_contacts
-- Held in an open transaction, it makes a build wait on its first read of contacts, where a slow
-- query would wait, until the transaction ends.
LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE;

-- name: devtools_builds_waiting_on_lock
-- Builds of this database waiting on a lock. Only a session of the same user sees another's
-- wait_event_type, so this runs as the owner the processes log in as.
SELECT count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'exports-builder' AND wait_event_type = 'Lock';

-- name: devtools_earlier_demo_databases
-- The databases of earlier demos on this server, all but the current one.
SELECT datname
FROM pg_database
WHERE datname LIKE 'demo\_%%' AND datname <> %(current)s
ORDER BY datname;
