"""psycopg errors, translated in one place.

Each class that can occur has a deliberate answer:

- connection loss (``OperationalError`` without an SQLSTATE, ``AdminShutdown``, a broken connection) and
  ``QueryCanceled`` (statement_timeout): the write may or may not have committed; ask the row.
- ``LockNotAvailable`` (55P03, lock_timeout): nothing was done; the caller answers Busy.
- ``UniqueViolation`` (23505): a real answer, told apart by its constraint name.
- ``SerializationFailure`` / ``DeadlockDetected``: the transaction rolled back; safe to run again.
- anything else (a constraint the statement should never break, a missing grant): a bug, raised.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg


class StoreError(Exception):
    """Base of the store's own errors."""


class ChangedUnderLock(StoreError):
    """Raised when a row changed while this transaction held its lock: impossible unless something
    writes without taking it. Nothing is recorded."""


def outcome_unknown(exc: BaseException) -> bool:
    """True when a statement may have committed although the client heard no answer."""
    if isinstance(exc, (pg.QueryCanceled, pg.AdminShutdown, pg.CrashShutdown, pg.CannotConnectNow)):
        return True
    if isinstance(exc, psycopg.OperationalError):
        # A reply lost after the server committed carries no SQLSTATE and leaves the connection broken.
        return exc.sqlstate is None or exc.sqlstate.startswith("08")
    return isinstance(exc, (psycopg.InterfaceError, OSError, TimeoutError))


def retryable(exc: BaseException) -> bool:
    """True when the transaction certainly rolled back and may simply be run again."""
    return isinstance(exc, (pg.SerializationFailure, pg.DeadlockDetected))


def lock_timeout(exc: BaseException) -> bool:
    return isinstance(exc, pg.LockNotAvailable)


def unique_violation(exc: BaseException, constraint: str | None = None) -> bool:
    if not isinstance(exc, pg.UniqueViolation):
        return False
    return constraint is None or exc.diag.constraint_name == constraint
