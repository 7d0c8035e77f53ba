"""What a chaos soak's system runs with: the short clock of its processes (``CHAOS_SETTINGS``), the
processes themselves, the tenant, operator, contacts and destinations it makes, and its timeouts. Read by
``ChaosSystem`` (devtools/exports_devtools/chaos/system.py) and the services it starts (services.py).
"""

from __future__ import annotations

import signal

#: The soak's clock, in seconds: leases, recovery, the sweeper and deferrals short enough that a fault's
#: consequence is repaired within seconds, and many faults fit in a few minutes.
CHAOS_SETTINGS: dict[str, str] = {
    "EXPORTS_LEASE_SECONDS": "4",
    "EXPORTS_RENEW_SECONDS": "1",
    "EXPORTS_RECOVERY_INTERVAL": "1",
    "EXPORTS_SWEEP_AFTER": "20",
    "EXPORTS_SWEEP_INTERVAL": "5",
    "EXPORTS_SCAVENGE_INTERVAL": "10",
    "EXPORTS_STOP_POLL_SECONDS": "0.5",
    "EXPORTS_RELAY_POLL_SECONDS": "1",
    # The circuit probes again within two seconds of a partner's return: with a partner-down fault every
    # few seconds, a longer cap would keep the partner unused most of the soak.
    "EXPORTS_DEFER_BASE_SECONDS": "0.25",
    "EXPORTS_DEFER_MAX_SECONDS": "2",
    "EXPORTS_RETRY_BACKOFF_SECONDS": "1",
    "EXPORTS_RETRY_INTERVAL": "2",
    "EXPORTS_SESSION_IDLE_SECONDS": "5",
    # Schedules fire every few seconds (SCHEDULES); a slot a killed or cut-off scheduler left is decided by
    # the next pass, and one older than the grace is recorded Missed.
    "EXPORTS_SCHEDULE_INTERVAL": "0.5",
    "EXPORTS_SCHEDULE_GRACE_SECONDS": "20",
    "EXPORTS_HEARTBEAT_SECONDS": "2",
    "EXPORTS_RELAY_METRICS": "off",
    "EXPORTS_SCHEDULER_METRICS": "off",
    "EXPORTS_WORKER_METRICS": "off",
    "EXPORTS_NOTIFIER_METRICS": "off",
    # A receiver that fails now and then is tried again within two seconds, so the settle sees it drained.
    "EXPORTS_WEBHOOK_POLL_SECONDS": "0.5",
    "EXPORTS_WEBHOOK_TIMEOUT_SECONDS": "2",
    "EXPORTS_WEBHOOK_BACKOFF_BASE_SECONDS": "0.25",
    "EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS": "2",
}
TENANT = "Chaos Retail"
OPERATOR = "chaos-operator"
CONTACTS = 2000
#: The destinations' names and the partner directories they deliver to; the second one is optional.
DESTINATIONS = (("partner", "/inbox"), ("partner-archive", "/archive"))
#: The processes, by name: the ``exports`` command each runs and the signal that stops it gracefully.
PROCESSES: dict[str, tuple[tuple[str, ...], int]] = {
    "relay": (("relay",), signal.SIGINT),
    "worker-1": (("worker", "--processes", "1", "--threads", "2"), signal.SIGTERM),
    "worker-2": (("worker", "--processes", "1", "--threads", "2"), signal.SIGTERM),
    # A third worker: the kills and stops at chosen points take one down every few seconds.
    "worker-3": (("worker", "--processes", "1", "--threads", "2"), signal.SIGTERM),
    "scheduler": (("scheduler",), signal.SIGTERM),
    # A second scheduler: the two race for every schedule slot (and every takeover), as two hosts' would.
    "scheduler-2": (("scheduler",), signal.SIGTERM),
    "notifier": (("notifier",), signal.SIGTERM),
}
#: The soak's schedules (with ``schedules=True``), on its first destination: (cron with seconds first,
#: incremental). Every few seconds each, so a soak decides hundreds of slots under its faults.
SCHEDULES = (("*/3 * * * * *", False), ("*/5 * * * * *", True))
#: The tenant's webhook endpoint: its name, the variable its signing secret is in (in the processes'
#: environment), and the share of requests its receiver answers 503 (a receiver that fails now and then).
WEBHOOK = "tenant-hooks"
WEBHOOK_SECRET_VAR = "CHAOS_HOOK_SECRET"
RECEIVER_FAILURE_RATE = 0.2
#: The application_name of every pool a worker process opens (app/actors): its sessions, for pg-terminate.
WORKER_APPLICATION_NAMES = ("exports-worker", "exports-slots", "exports-builder", "exports-lease", "exports-watcher")
#: Seconds one setup command may take; seconds a service gets to start.
COMMAND_TIMEOUT = 120.0
START_TIMEOUT = 30.0
#: The partner's login.
PARTNER_USER = "partner"
