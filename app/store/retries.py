"""The retry policy's read (``sql/retries.sql``): proven transient non-deliveries due for another try."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg

from app.store import connector


@dataclass(frozen=True)
class RetryCandidate:
    job_id: UUID
    tenant_id: UUID
    attempt_id: UUID
    delivery_key: str
    original_job_id: UUID
    overwrite_agreement_ref: str | None
    #: The Finished event's detail: the outcome, its code and cause, and what happened.
    detail: str
    #: Retries the policy already created for this delivery key, and how many its destination allows.
    retries: int
    auto_retries: int


def scan_due(conn: psycopg.Connection, *, created_by: str, backoff_seconds: float, window_seconds: float,
             batch_size: int) -> list[RetryCandidate]:
    rows = connector.fetch_all(conn, "retries_scan_due", dict(
        created_by=created_by, backoff_seconds=backoff_seconds, window_seconds=window_seconds,
        batch_size=batch_size))
    return [RetryCandidate(job_id=r["id"], tenant_id=r["tenant_id"], attempt_id=r["attempt_id"],
                           delivery_key=r["delivery_key"], original_job_id=r["original_job_id"],
                           overwrite_agreement_ref=r["overwrite_agreement_ref"], detail=r["detail"],
                           retries=r["retries"], auto_retries=r["auto_retries"])
            for r in rows]
