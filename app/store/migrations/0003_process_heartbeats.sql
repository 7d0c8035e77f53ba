-- Each long-running process (relay, worker, scheduler) records that it is alive, for `exports health`,
-- `exports processes` and the metrics. The protocol never reads this table: a dead process is found
-- by its lease or its outbox, not by its heartbeat.
CREATE TABLE process_heartbeats (
    process_id   text PRIMARY KEY,               -- host:pid, the prefix of a worker's claimed_by
    role         text NOT NULL CHECK (role IN ('relay', 'worker', 'scheduler')),
    host         text NOT NULL,
    pid          int  NOT NULL,
    version      text NOT NULL,                  -- the exports release the process runs
    started_at   timestamptz NOT NULL,
    beat_at      timestamptz NOT NULL,
    stopped_at   timestamptz                     -- set by a clean shutdown
);

CREATE INDEX ix_process_heartbeats_beat ON process_heartbeats (beat_at);

GRANT SELECT, INSERT, UPDATE (beat_at, stopped_at, version, started_at, role, host, pid)
    ON process_heartbeats TO exports_app, exports_dispatcher;
-- Forget processes dead for long (exports processes --forget); nothing else deletes.
GRANT DELETE ON process_heartbeats TO exports_app;
