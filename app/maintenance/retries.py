"""The retry policy: a new delivery, automatically, for a delivery proven not to have happened for a
transient reason.

When a delivery past cutoff 2 ends Failed (NotDelivered) because the connection broke, the classifier
has already proven the final name was never written, so trying again cannot duplicate anything. The
policy creates the replacement the reference allows (``export.create_replacement``: same delivery key,
the original locked and re-checked), created by ``retry-policy`` with a reason that names the attempt
and its cause, after a backoff that doubles with each retry, and at most the destination's
``auto_retries`` times per delivery key (0: off). It never retries an OutcomeUnknown (that waits for
evidence or an operator), a configuration error, or a refusal by the partner. Of two schedulers that
pick the same job, one creates the replacement; the other is refused by ``uq_export_jobs_one_replacement``.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from app import logs, metrics
from app.config import ConfigError, Settings
from app.store import export, retries
from app.store.database import Database
from app.store.retries import RetryCandidate
from app.store.types import ReplacementResult

log = logs.get(__name__)

#: The creator the policy records on the replacements it makes.
CREATED_BY = "retry-policy"
#: Candidates one run reads.
DEFAULT_BATCH = 100
#: A non-delivery older than this, in seconds, is left to an operator.
DEFAULT_WINDOW_SECONDS = 24 * 3600.0
#: Longest cause kept in a replacement's reason, in characters.
MAX_CAUSE_CHARS = 200


@dataclass(frozen=True)
class RetryConfig:
    backoff_seconds: float
    batch_size: int = DEFAULT_BATCH
    window_seconds: float = DEFAULT_WINDOW_SECONDS

    def __post_init__(self) -> None:
        if not self.backoff_seconds > 0 or not self.window_seconds > 0:
            raise ConfigError("backoff_seconds and window_seconds must be positive")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of at least 1, not {self.batch_size!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryConfig:
        return cls(backoff_seconds=settings.retry_backoff_seconds)


@dataclass(frozen=True)
class RetryCounts:
    due: int = 0
    created: int = 0
    #: Another scheduler (or an operator) created a replacement first.
    slot_taken: int = 0
    #: The original may no longer be replaced (corrected, say): nothing created.
    not_allowed: int = 0
    errors: int = 0


def replacement_reason(candidate: RetryCandidate) -> str:
    cause = candidate.detail.split(": ", 1)[1] if ": " in candidate.detail else candidate.detail
    return (f"automatic retry {candidate.retries + 1} of {candidate.auto_retries}: attempt {candidate.attempt_id} "
            f"of export {candidate.job_id} was proven not delivered ({cause[:MAX_CAUSE_CHARS]})")


class Retries:
    """Creates the replacements due for proven transient non-deliveries. ``db`` runs as exports_app."""

    def __init__(self, db: Database, config: RetryConfig):
        self.db = db
        self.config = config

    def run_once(self) -> RetryCounts:
        counts = dict(dataclasses.asdict(RetryCounts()))
        with self.db.connection() as conn:
            due = retries.scan_due(conn, created_by=CREATED_BY, backoff_seconds=self.config.backoff_seconds,
                                   window_seconds=self.config.window_seconds, batch_size=self.config.batch_size)
        counts["due"] = len(due)
        for candidate in due:
            try:
                with self.db.connection() as conn:
                    result = export.create_replacement(
                        conn, job_id=uuid.uuid4(), tenant_id=candidate.tenant_id,
                        original_job_id=candidate.original_job_id, created_by=CREATED_BY,
                        replacement_reason=replacement_reason(candidate),
                        overwrite_agreement_ref=candidate.overwrite_agreement_ref)
            except Exception as exc:
                counts["errors"] += 1
                log.warning("retries.create_failed", job_id=candidate.job_id, error=type(exc).__name__)
                continue
            field = {ReplacementResult.CREATED: "created", ReplacementResult.SLOT_TAKEN: "slot_taken",
                     ReplacementResult.NOT_ALLOWED: "not_allowed"}[result]
            counts[field] += 1
            if result is ReplacementResult.CREATED:
                metrics.scheduler().automatic_retries.inc()
            log.info("retries.replacement", job_id=candidate.job_id, tenant_id=candidate.tenant_id,
                     original_job_id=candidate.original_job_id, retry=candidate.retries + 1, result=result.value)
        result_counts = RetryCounts(**counts)
        if result_counts.due:
            log.info("retries.run", **{k: v for k, v in counts.items() if v})
        return result_counts
