"""``exports health``: is this deployment doing its job? A readiness check of the whole deployment: exit 0
only when every check passes, and each failed check says why in one line. It is not a liveness probe
for one process (a dead relay fails every host's check, and restarting the host that asked cures
nothing): ``exports health --process ROLE`` is that, asking this host's process of that role for its
own metrics endpoint (``probe_process``), without the database.

It checks what an operator must act on, by its symptoms rather than by process lists alone:
- the database answers and runs this release's schema;
- the broker answers;
- the relay keeps up (the oldest unpublished outbox row is young);
- recovery keeps up (no lease has been expired for long: a dead scheduler shows here first);
- the sweeper's backstop is not the only thing moving work (no job waits in Queued far past the
  sweeper's threshold);
- tenants' webhooks reach their receivers (no event owed to an endpoint for longer than
  EXPORTS_WEBHOOK_LATE_SECONDS, none given up in the last day);
- and, if asked (``--require relay,worker,scheduler,notifier``), that a process of each role has a recent
  heartbeat.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict

from app.config import ConfigError, Settings
from app.heartbeat import SILENT_INTERVALS
from app.metrics import parse_address
from app.store import heartbeat, metrics, migrate
from app.store.database import connect
from app.store.types import Role

#: Seconds the oldest unpublished outbox row may wait before the relay counts as behind.
MAX_RELAY_LAG_SECONDS = 60.0
#: Recovery runs this many times its interval, plus this slack, before an expired lease counts as stuck.
RECOVERY_INTERVALS = 3
RECOVERY_SLACK_SECONDS = 30.0
ROLES = ("relay", "worker", "scheduler", "notifier")
#: Late endpoints a failed webhooks check names.
LATE_NAMED = 3
#: Seconds a liveness probe waits for a process's metrics endpoint.
PROBE_TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def run(settings: Settings, url: str, *, require: Iterable[str] = ()) -> list[Check]:
    """Every check; the database ones are skipped (and reported failed) when it cannot be reached."""
    checks = [_broker(settings)]
    try:
        conn = connect(url, Role.APP, application_name="exports-health")
    except Exception as exc:
        return [Check("database", False, f"cannot connect: {cause(exc, url)}"), *checks]
    with conn:
        checks.insert(0, Check("database", True, "answers"))
        version = migrate.current_version(conn)
        checks.append(Check("schema", version == migrate.SCHEMA_VERSION,
                            f"version {version}, this release runs {migrate.SCHEMA_VERSION}"
                            + ("" if version == migrate.SCHEMA_VERSION else ": run exports db migrate")))
        if version < migrate.SCHEMA_VERSION:
            return checks
        backlog = metrics.backlog(conn)
        processes = heartbeat.processes(conn)
        hooks = metrics.webhooks(conn, late_seconds=settings.webhook_late_seconds)
        late = metrics.late_webhooks(conn, late_seconds=settings.webhook_late_seconds, limit=LATE_NAMED)
    checks.append(Check("relay", backlog.oldest_unpublished_seconds <= MAX_RELAY_LAG_SECONDS,
                        f"{backlog.unpublished} unpublished outbox rows, the oldest "
                        f"{backlog.oldest_unpublished_seconds:.0f} s old (limit {MAX_RELAY_LAG_SECONDS:.0f} s)"))
    stuck_after = RECOVERY_INTERVALS * settings.recovery_interval_seconds + RECOVERY_SLACK_SECONDS
    checks.append(Check("recovery", backlog.oldest_expired_lease_seconds <= stuck_after,
                        f"{backlog.expired_leases} expired leases, the oldest expired "
                        f"{backlog.oldest_expired_lease_seconds:.0f} s ago (limit {stuck_after:.0f} s)"))
    queued_limit = 2 * settings.sweep_after_seconds
    checks.append(Check("queue", backlog.oldest_queued_seconds <= queued_limit,
                        f"the longest wait in Queued since a wake-up is {backlog.oldest_queued_seconds:.0f} s "
                        f"(limit {queued_limit:.0f} s, twice the sweeper's threshold)"))
    checks.append(_webhooks(settings, hooks, late))
    silent_limit = SILENT_INTERVALS * settings.heartbeat_seconds
    live = {role: [p for p in processes if p.identity.role == role and p.stopped_at is None
                   and p.silent_seconds <= silent_limit] for role in ROLES}
    for role in require:
        checks.append(Check(f"{role} processes", bool(live[role]),
                            f"{len(live[role])} live (a heartbeat within {silent_limit:.0f} s)"))
    return checks


def cause(exc: BaseException, url: str) -> str:
    """Why a connection failed, in one line: the error's class and its first line (libpq's says which host
    and port refused, or which login it rejected), with the URL's password cut out should it appear."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    try:
        password = conninfo_to_dict(url).get("password")
    except Exception:   # a URL libpq cannot parse says so itself, in the message
        password = None
    if password:
        first = first.replace(str(password), "***")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def probe_process(settings: Settings, role: str, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> Check:
    """Liveness of this host's process of ``role``: its metrics endpoint (EXPORTS_<ROLE>_METRICS) answers
    with its build-info metric. A process whose HTTP thread answers may still have a stuck main loop:
    the readiness checks (relay lag, recovery, heartbeats) see that, deployment-wide."""
    address = parse_address(getattr(settings, f"{role}_metrics"))
    if address is None:
        raise ConfigError(f"EXPORTS_{role.upper()}_METRICS is off: the {role} serves no endpoint to probe")
    host, port = address
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    where = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
    try:
        with urllib.request.urlopen(where, timeout=timeout) as reply:   # noqa: S310 (our own endpoint)
            body = reply.read(1 << 20).decode("utf-8", "replace")
    except Exception as exc:
        return Check(f"{role} process", False, f"{where} does not answer: {cause(exc, '')}")
    if "exports_build_info" not in body:
        return Check(f"{role} process", False, f"{where} answers, but not as an exports {role} (no build info)")
    return Check(f"{role} process", True, f"{where} answers")


def _webhooks(settings: Settings, hooks: metrics.WebhookBacklog, late: list[metrics.LateWebhook]) -> Check:
    limit = settings.webhook_late_seconds
    detail = (f"{hooks.pending} events owed to receivers, the oldest {hooks.oldest_pending_seconds:.0f} s old "
              f"(limit {limit:.0f} s); {hooks.dead_last_day} given up in the last day")
    if late:
        named = ", ".join(f"{w.tenant}/{w.webhook} ({w.seconds:.0f} s)" for w in late)
        more = hooks.late_endpoints - len(late)
        detail += f"; late: {named}" + (f" and {more} more" if more > 0 else "") + \
            " (receiver down, or no exports notifier running: exports webhook list)"
    return Check("webhooks", hooks.late_endpoints == 0 and hooks.dead_last_day == 0, detail)


def _broker(settings: Settings) -> Check:
    url = settings.broker_url
    if url is None:
        return Check("broker", True, "the embedded Redis (started on first use)")
    try:
        if url.startswith(("redis://", "rediss://", "unix://")):
            import redis

            redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
        else:
            import pika

            params = pika.URLParameters(url)
            params.socket_timeout = params.blocked_connection_timeout = 3
            params.connection_attempts = 1
            pika.BlockingConnection(params).close()
    except Exception as exc:
        # The class only: a broker error can carry its URL, and with it a password.
        return Check("broker", False, f"does not answer: {type(exc).__name__}")
    return Check("broker", True, "answers")
