"""Creates that can be retried: a create or replace request recorded with the export it made.

Like a cancellation request (``app.store.cancellation``), a request id is the client's, once per
submission, unique per tenant and bound to the operator and the terms: the same id with the same terms
answers the export already created (a replay); with other terms, or by another operator, it is refused
(RequestIdReused). One short transaction with a lock timeout: the lookup, the request's insert (which
takes the id's key first, so a second submission of the same id waits there, before any other work),
then the export's own statements. A lock timeout answers Busy with nothing written; a commit whose reply
was lost is settled by reading the request back on a fresh connection, never from the exception.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import PoolTimeout

from app import logs
from app.store import connector, errors, export
from app.store.errors import StoreError, Violation
from app.store.types import ReplacementResult

log = logs.get(__name__)

#: How long each statement of the transaction waits for a lock (the request id's key, the destination's
#: file sequence, a replacement's original) before answering Busy.
LOCK_TIMEOUT = "2s"

Connect = Callable[[], AbstractContextManager[psycopg.Connection]]


class RequestKind(enum.StrEnum):
    CREATE = "Create"
    REPLACE = "Replace"


class CreateReply(enum.Enum):
    """How a submission ended. Only CREATED wrote (or, for a replay, had written) an export."""

    CREATED = "Created"
    #: The id was recorded for another export, another operator or other terms; nothing written.
    REQUEST_ID_REUSED = "RequestIdReused"
    #: A lock was held past the lock timeout; nothing written. Retry with the same id.
    BUSY = "Busy"
    #: Create: the destination is not the tenant's.
    UNKNOWN_DESTINATION = "UnknownDestination"
    #: Create: the delivery key is taken in the tenant (a key is minted per export, so: never).
    KEY_TAKEN = "KeyTaken"
    #: Replace: the original may not be replaced.
    NOT_ALLOWED = "NotAllowed"
    #: Replace: the original already has a live or delivered replacement.
    SLOT_TAKEN = "SlotTaken"
    #: The commit's reply was lost and the request could not be read back: retry with the same id.
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Terms:
    """What a request asks for; a replay must ask for the same. A replacement's reason is not a term (the
    first one stands, as a cancellation's does); its overwrite agreement is."""

    kind: RequestKind
    requested_by: str
    destination_id: UUID | None = None
    original_job_id: UUID | None = None
    overwrite_agreement_ref: str | None = None

    @classmethod
    def of(cls, row: dict[str, Any]) -> Terms:
        return cls(RequestKind(row["kind"]), row["requested_by"], row["destination_id"], row["original_job_id"],
                   row["overwrite_agreement_ref"])


@dataclass(frozen=True)
class CreateAnswer:
    reply: CreateReply
    request_id: UUID
    job_id: UUID | None = None
    delivery_key: str | None = None
    file_name: str | None = None
    #: A replay: when the request was first recorded (its export is the one it created then).
    replay_of: datetime | None = None


@dataclass(frozen=True)
class Made:
    """What the export's own statements answered, inside the request's transaction."""

    reply: CreateReply
    delivery_key: str | None = None
    file_name: str | None = None


#: Runs the export's statements on the request's connection, in its transaction, for the export id given.
Make = Callable[[psycopg.Connection, UUID], Made]


def find(conn: psycopg.Connection, *, tenant_id: UUID, request_id: UUID) -> dict[str, Any] | None:
    return connector.fetch_one(conn, "creation_find_request", dict(tenant_id=tenant_id, request_id=request_id))


def record(conn: psycopg.Connection, *, tenant_id: UUID, request_id: UUID, job_id: UUID, terms: Terms) -> None:
    inserted = connector.execute(conn, "creation_record_request", dict(
        tenant_id=tenant_id, request_id=request_id, kind=terms.kind.value, job_id=job_id,
        requested_by=terms.requested_by, destination_id=terms.destination_id, original_job_id=terms.original_job_id,
        overwrite_agreement_ref=terms.overwrite_agreement_ref))
    if inserted != 1:
        raise StoreError(f"create request {request_id} was not recorded")


def submit(connect: Connect, *, tenant_id: UUID, request_id: UUID, job_id: UUID, terms: Terms, make: Make,
           lock_timeout: str = LOCK_TIMEOUT, _retried: bool = False) -> CreateAnswer:
    """Records the request and makes its export (``make``) in one transaction, or answers from the request
    already recorded. ``connect`` opens autocommit connections: one for the transaction, a fresh one to
    read the request back when its commit's reply was lost."""
    try:
        with connect() as conn:
            return _decide_and_create(conn, tenant_id, request_id, job_id, terms, make, lock_timeout)
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is not Violation.CREATE_REQUEST_TAKEN:
            raise
        # The same id committed first while this submission waited on its key: answer from its record.
        earlier = _read_back(connect, tenant_id, request_id)
        if not isinstance(earlier, dict):
            raise
        return _answer_for_earlier(earlier, terms, request_id)
    except psycopg.OperationalError as exc:
        if errors.lock_timeout(exc):
            log.info("creation.busy", tenant_id=tenant_id, request_id=request_id)
            return CreateAnswer(CreateReply.BUSY, request_id)
        if not errors.outcome_unknown(exc):
            raise
        log.warning("creation.response_lost", tenant_id=tenant_id, request_id=request_id, error=type(exc).__name__)
    # The commit's reply was lost: only the request, read back, says whether it committed.
    earlier = _read_back(connect, tenant_id, request_id)
    if earlier is _UNANSWERED:
        return CreateAnswer(CreateReply.UNKNOWN, request_id)
    if earlier is None:
        if _retried:
            return CreateAnswer(CreateReply.UNKNOWN, request_id)
        # Nothing committed, so nothing can be created twice: run it once more, under the same id.
        return submit(connect, tenant_id=tenant_id, request_id=request_id, job_id=job_id, terms=terms, make=make,
                      lock_timeout=lock_timeout, _retried=True)
    assert isinstance(earlier, dict)
    if earlier["job_id"] == job_id:
        # This submission's own commit: created, not a replay.
        return CreateAnswer(CreateReply.CREATED, request_id, job_id, earlier["delivery_key"], earlier["file_name"])
    return _answer_for_earlier(earlier, terms, request_id)


def _decide_and_create(conn: psycopg.Connection, tenant_id: UUID, request_id: UUID, job_id: UUID, terms: Terms,
                       make: Make, lock_timeout: str) -> CreateAnswer:
    made = Made(CreateReply.UNKNOWN)
    with conn.transaction() as tx:
        connector.set_config(conn, "lock_timeout", lock_timeout, local=True)
        earlier = find(conn, tenant_id=tenant_id, request_id=request_id)
        if earlier is not None:
            return _answer_for_earlier(earlier, terms, request_id)
        # The id's key first: a second submission of it waits here until this one commits or rolls back.
        record(conn, tenant_id=tenant_id, request_id=request_id, job_id=job_id, terms=terms)
        made = make(conn, job_id)
        if made.reply is not CreateReply.CREATED:
            raise psycopg.Rollback(tx)   # nothing created: the request is not recorded either
    if made.reply is not CreateReply.CREATED:
        return CreateAnswer(made.reply, request_id)
    return CreateAnswer(CreateReply.CREATED, request_id, job_id, made.delivery_key, made.file_name)


#: The read-back did not answer either.
_UNANSWERED = object()


def _read_back(connect: Connect, tenant_id: UUID, request_id: UUID) -> dict[str, Any] | None | object:
    try:
        with connect() as conn:
            return find(conn, tenant_id=tenant_id, request_id=request_id)
    except Exception as exc:
        if errors.outcome_unknown(exc) or isinstance(exc, PoolTimeout):
            return _UNANSWERED
        raise


def _answer_for_earlier(earlier: dict[str, Any], terms: Terms, request_id: UUID) -> CreateAnswer:
    if Terms.of(earlier) != terms:
        # A client error; it says nothing about the other request.
        return CreateAnswer(CreateReply.REQUEST_ID_REUSED, request_id)
    return CreateAnswer(CreateReply.CREATED, request_id, earlier["job_id"], earlier["delivery_key"],
                        earlier["file_name"], replay_of=earlier["recorded_at"])


# --- replace -------------------------------------------------------------------------------------

_REPLACEMENT_REPLY = {ReplacementResult.CREATED: CreateReply.CREATED, ReplacementResult.NOT_ALLOWED:
                      CreateReply.NOT_ALLOWED, ReplacementResult.SLOT_TAKEN: CreateReply.SLOT_TAKEN}


def submit_replacement(connect: Connect, *, tenant_id: UUID, request_id: UUID, job_id: UUID, original_job_id: UUID,
                       requested_by: str, replacement_reason: str, overwrite_agreement_ref: str | None = None,
                       lock_timeout: str = LOCK_TIMEOUT) -> CreateAnswer:
    """``export.create_replacement`` under a request id. The caller resolves a replacement's id to its
    original first, so naming either is the same request."""
    terms = Terms(RequestKind.REPLACE, requested_by, original_job_id=original_job_id,
                  overwrite_agreement_ref=overwrite_agreement_ref)

    def make(conn: psycopg.Connection, new_job_id: UUID) -> Made:
        result = export.create_replacement(conn, job_id=new_job_id, tenant_id=tenant_id,
                                           original_job_id=original_job_id, created_by=requested_by,
                                           replacement_reason=replacement_reason,
                                           overwrite_agreement_ref=overwrite_agreement_ref)
        if result is not ReplacementResult.CREATED:
            return Made(_REPLACEMENT_REPLY[result])
        row = connector.fetch_one(conn, "creation_read_delivery", dict(tenant_id=tenant_id, job_id=new_job_id))
        assert row is not None   # created in this transaction
        return Made(CreateReply.CREATED, row["delivery_key"], row["file_name"])

    return submit(connect, tenant_id=tenant_id, request_id=request_id, job_id=job_id, terms=terms, make=make,
                  lock_timeout=lock_timeout)
