"""psycopg errors, translated in one place.

Each class that can occur has a deliberate answer:

- connection loss (``OperationalError`` without an SQLSTATE, ``AdminShutdown``, a broken connection) and
  ``QueryCanceled`` (statement_timeout): the write may or may not have committed; ask the row.
- ``LockNotAvailable`` (55P03, lock_timeout): nothing was done; the caller answers Busy.
- ``UniqueViolation`` (23505) and ``ForeignKeyViolation`` (23503): a real answer when the constraint is
  one of ``Violation``'s, told apart by its name; any other is a bug, raised.
- ``SerializationFailure`` / ``DeadlockDetected``: the transaction rolled back; safe to run again.
- anything else (a constraint the statement should never break, a missing grant): a bug, raised.
"""

from __future__ import annotations

import enum

import psycopg
from psycopg import errors as pg

from app.errors import ExportsError


class StoreError(ExportsError):
    """Raised when a statement did something its conditions make impossible (a row count that cannot
    be); nothing more is written."""


class ChangedUnderLock(StoreError):
    """Raised when a row changed while this transaction held its lock: impossible unless something
    writes without taking it. Nothing is recorded."""


class Violation(enum.Enum):
    """The constraints whose violation is an answer rather than a bug, by what it means."""

    #: The tenant already has a delivery with this key.
    KEY_TAKEN = "KeyTaken"
    #: The job names a destination that is not its tenant's.
    UNKNOWN_DESTINATION = "UnknownDestination"
    #: The row names a tenant that does not exist.
    UNKNOWN_TENANT = "UnknownTenant"
    #: The original already has a live or delivered replacement.
    REPLACEMENT_SLOT_TAKEN = "ReplacementSlotTaken"
    #: This attempt already recorded this transition (one Reconciled, one Corrected per attempt).
    TRANSITION_RECORDED = "TransitionRecorded"
    #: The tenant already recorded a cancellation request with this id.
    REQUEST_ID_TAKEN = "RequestIdTaken"
    #: The tenant already recorded a create or replace request with this id.
    CREATE_REQUEST_TAKEN = "CreateRequestTaken"
    #: The schedule already has an export for this slot.
    SLOT_TAKEN = "SlotTaken"
    #: The tenant already has a live webhook endpoint of this name.
    WEBHOOK_NAME_TAKEN = "WebhookNameTaken"


_VIOLATIONS = {
    "pk_deliveries": Violation.KEY_TAKEN,
    "uq_export_jobs_original_key": Violation.KEY_TAKEN,
    "fk_export_jobs_destination": Violation.UNKNOWN_DESTINATION,
    "fk_schedules_destination": Violation.UNKNOWN_DESTINATION,
    "destinations_tenant_id_fkey": Violation.UNKNOWN_TENANT,
    "operator_access_tenant_id_fkey": Violation.UNKNOWN_TENANT,
    "contacts_tenant_id_fkey": Violation.UNKNOWN_TENANT,
    "uq_export_jobs_one_replacement": Violation.REPLACEMENT_SLOT_TAKEN,
    "uq_attempt_transition": Violation.TRANSITION_RECORDED,
    "pk_cancellation_requests": Violation.REQUEST_ID_TAKEN,
    "pk_create_requests": Violation.CREATE_REQUEST_TAKEN,
    "uq_export_jobs_slot": Violation.SLOT_TAKEN,
    "uq_webhook_endpoints_live_name": Violation.WEBHOOK_NAME_TAKEN,
    "webhook_endpoints_tenant_id_fkey": Violation.UNKNOWN_TENANT,
}


def violation(exc: BaseException) -> Violation | None:
    """What a unique or foreign-key violation means, or None when it is not one we answer."""
    if not isinstance(exc, (pg.UniqueViolation, pg.ForeignKeyViolation)):
        return None
    return _VIOLATIONS.get(exc.diag.constraint_name or "")


def outcome_unknown(exc: BaseException) -> bool:
    """True when a statement may have committed although the client heard no answer."""
    if isinstance(exc, (pg.QueryCanceled, pg.AdminShutdown, pg.CrashShutdown, pg.CannotConnectNow)):
        return True
    if isinstance(exc, psycopg.OperationalError):
        # A reply lost after the server committed carries no SQLSTATE and leaves the connection broken.
        return exc.sqlstate is None or exc.sqlstate.startswith("08")
    return isinstance(exc, (psycopg.InterfaceError, OSError, TimeoutError))


def transient(exc: BaseException) -> bool:
    """True for a database error that says nothing about the data or the query: the connection was
    lost or terminated, the server is shutting down or starting, a statement timeout, a serialization
    failure. Running the same work again on a fresh connection may succeed; any other error would fail
    the same way again."""
    return isinstance(exc, psycopg.Error) and (outcome_unknown(exc) or retryable(exc))


def retryable(exc: BaseException) -> bool:
    """True when the transaction certainly rolled back and may simply be run again."""
    return isinstance(exc, (pg.SerializationFailure, pg.DeadlockDetected))


def lock_timeout(exc: BaseException) -> bool:
    return isinstance(exc, pg.LockNotAvailable)
