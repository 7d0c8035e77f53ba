"""The export actor: one wake-up message, ``export_ready(job_id)``, runs the export runner.

Settlement is Dramatiq's: a message is acked when the actor returns, and retried when it raises.
- Every outcome of the runner returns normally, so the message is settled: once the claim is
  confirmed (or lost) the row, not the message, carries the job.
- The one deliberate exception is ``ClaimUnknown``: the claim and its re-read both failed, so nobody
  knows whether this worker owns the job. Raising it leaves the message unsettled, and Dramatiq
  delivers it again with backoff. If the claim had in fact committed, the redelivery finds the job
  Running and does nothing, and recovery takes the attempt over when its lease expires.

Options, set deliberately rather than inherited:
- ``time_limit`` is infinite. Dramatiq's TimeLimit (10 minutes by default) raises an asynchronous
  ``BaseException`` at the next bytecode, which mid-upload would turn a good delivery into
  OutcomeUnknown and could land between the evidence and the terminal write. Hangs are bounded where
  they can happen instead: SFTP connect and I/O timeouts, the re-read's statement timeout, and the
  lease, which lets recovery take over an attempt that stopped renewing. (``None`` would break the
  TimeLimit middleware; ``inf`` does not.)
- ``max_retries`` bounds the redeliveries of a message that keeps failing before its claim (the
  database is unreachable): after them it is dead-lettered, and the sweeper republishes the still
  Queued job. An unexpected error after the claim is retried too, harmlessly: the retry finds the job
  no longer Queued and settles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from uuid import UUID

import dramatiq

from app import logs, metrics
from app.actors.builder import ContactsBuilder
from app.actors.deferral import DeferralPolicy
from app.actors.lease import Leases
from app.actors.policy import ExportPolicy
from app.actors.runner import ExportRunner, RunOutcome, RunResult
from app.actors.slots import DatabaseSlots
from app.actors.watcher import StopWatcher
from app.config import Settings
from app.delivery.credentials import CredentialCache
from app.delivery.destination import Destination
from app.delivery.sessions import SessionPool
from app.errors import ExportsError
from app.store.database import Database
from app.store.types import Role

log = logs.get(__name__)

QUEUE = "exports"
ACTOR_NAME = "export_ready"
#: No time limit, in milliseconds (see above).
TIME_LIMIT_MS = float("inf")
#: Redeliveries of a message whose claim stayed unknown (or that failed before its claim).
MAX_RETRIES = 10
#: Backoff between those redeliveries, in milliseconds: the database gets time to come back.
MIN_BACKOFF_MS = 1_000
MAX_BACKOFF_MS = 60_000

#: Connections that hold session slots, at most: one per SSH session this process has open.
SLOT_CONNECTIONS = 16

ACTOR_OPTIONS = dict(time_limit=TIME_LIMIT_MS, max_retries=MAX_RETRIES, min_backoff=MIN_BACKOFF_MS,
                     max_backoff=MAX_BACKOFF_MS)


class ClaimUnknown(ExportsError):
    """Raised when the claim and its re-read both failed: the message stays unsettled and is retried."""


Run = Callable[[UUID], RunResult]


def declare(broker: dramatiq.Broker, run: Run, **options: object) -> dramatiq.Actor:
    """Declares ``export_ready`` on ``broker``, running ``run``: the worker process's runner
    (``app/worker.py``); tests pass their own, and may override options."""

    def export_ready(job_id: str) -> None:
        result = run(UUID(job_id))
        metrics.worker().runs.labels(result.outcome.value).inc()
        log.info("export.processed", job_id=job_id, tenant_id=result.tenant_id, outcome=result.outcome.value,
                 attempt_id=result.attempt_id, write=result.write.value if result.write else None)
        if result.outcome is RunOutcome.CLAIM_UNKNOWN:
            raise ClaimUnknown(f"claim of job {job_id} unconfirmed: leaving the message unsettled")

    return dramatiq.Actor(export_ready, broker=broker, actor_name=ACTOR_NAME, queue_name=QUEUE, priority=0,
                          options={**ACTOR_OPTIONS, **options})


class BindMessage(dramatiq.Middleware):
    """Binds the wake-up's ``message_id`` and ``job_id`` to every line logged while the worker thread
    handles it (the deduplication's skip, the runner's, the delivery's, the store's), from before the
    first middleware looks at it until after the last. Added first, so it binds before the others run."""

    def __init__(self) -> None:
        self._tokens = threading.local()

    def before_process_message(self, broker, message) -> None:
        fields = {"message_id": message.message_id}
        if message.actor_name == ACTOR_NAME and message.args:
            fields["job_id"] = message.args[0]
        self._tokens.token = logs.bind(**fields)

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self._unbind()

    def after_skip_message(self, broker, message) -> None:
        self._unbind()

    def _unbind(self) -> None:
        token = getattr(self._tokens, "token", None)
        if token is not None:   # None when an earlier middleware raised before this one bound
            self._tokens.token = None
            logs.unbind(token)


class StopPreparationOnShutdown(dramatiq.Middleware):
    """When the worker shuts down, attempts still building stop at once and write nothing, instead
    of holding the shutdown for the length of a build; recovery requeues them once their leases
    expire. An upload in progress is left to finish."""

    def __init__(self, runner: Callable[[], ExportRunner | None]) -> None:
        #: The process's runner, None while it was never built (then nothing is building).
        self.runner = runner

    def before_worker_shutdown(self, broker, worker) -> None:
        runner = self.runner()
        if runner is not None:
            stopped = runner.shutdown()
            if stopped:
                log.info("export.shutdown_stopped_preparation", attempts=stopped)


def build_runner(settings: Settings, url: str, **overrides: object) -> tuple[ExportRunner, Callable[[], None]]:
    """A runner wired from settings on the database ``url`` (the application's login), and the function
    that releases what it holds."""
    db = Database(url, Role.APP, max_size=8, name="exports-worker")
    # One connection per SSH session open to a partner (each holds its session slot's lock): the
    # worker's threads, and the warm sessions kept between deliveries.
    slots_db = Database(url, Role.APP, min_size=0, max_size=SLOT_CONNECTIONS, name="exports-slots")
    sessions = SessionPool(DatabaseSlots(slots_db), idle_seconds=settings.session_idle_seconds)
    watcher = StopWatcher(url, poll_seconds=settings.stop_poll_seconds)
    leases = Leases(url, lease_seconds=settings.lease_seconds, renew_seconds=settings.renew_seconds)
    builder = ContactsBuilder(url, settings.work_dir)
    credentials = CredentialCache()
    parts: dict[str, object] = dict(
        db=db, lease_seconds=settings.lease_seconds, policy=ExportPolicy(),
        builder=builder, leases=leases, watcher=watcher, sessions=sessions,
        deferrals=DeferralPolicy.from_settings(settings),
        destination_for=lambda config: Destination(config, credentials=credentials))
    parts.update(overrides)
    runner = ExportRunner(**parts)  # type: ignore[arg-type]

    def close() -> None:
        watcher.close()
        if "db" in leases.__dict__:   # its pool, if a renewal ever opened it
            leases.db.close()
        sessions.close()
        slots_db.close()
        builder.close()
        db.close()

    return runner, close
