"""A destination's session slots, held in the database so every worker host shares the count.

A slot is a session-level advisory lock keyed by the destination and a slot number
(``app.store.partner.try_slot``), taken without waiting on a connection from a pool of its own; the
connection stays with the SSH session that holds the slot until that session is closed, and the lock is
released before the connection goes back. If the release cannot be confirmed the connection is closed
instead, which releases the lock with the database session, as a worker that dies does.
"""

from __future__ import annotations

import random
from contextlib import AbstractContextManager
from uuid import UUID

import psycopg

from app import logs
from app.store import partner
from app.store.database import Database

log = logs.get(__name__)

#: Seconds to wait for a connection to hold a slot on before treating every slot as taken.
CONNECTION_TIMEOUT_SECONDS = 2.0


class HeldSlot:
    def __init__(self, checkout: AbstractContextManager[psycopg.Connection], conn: psycopg.Connection,
                 destination_id: UUID, slot: int) -> None:
        self._checkout = checkout
        self._conn = conn
        self.destination_id = destination_id
        self.slot = slot
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            why = self._unlock()
            if why is not None:
                # Closing the session releases every lock it holds; the pool discards a closed connection.
                log.warning("slots.release_failed", destination_id=self.destination_id, slot=self.slot, error=why)
                self._conn.close()
        finally:
            self._checkout.__exit__(None, None, None)

    def _unlock(self) -> str | None:
        """None once the advisory lock is released; else why its release is not confirmed."""
        try:
            held = partner.release_slot(self._conn, destination_id=self.destination_id, slot=self.slot)
        except Exception as exc:
            return type(exc).__name__
        return None if held else "NotHeld"

    def __repr__(self) -> str:
        return f"HeldSlot(destination_id={self.destination_id}, slot={self.slot})"


class DatabaseSlots:
    """``app.delivery.sessions.Slots`` on a pool dedicated to slot holders (one connection per open SSH
    session of this process)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def take(self, destination_id: UUID, max_sessions: int) -> HeldSlot | None:
        """One free slot of the destination, tried in random order so holders spread over the slots;
        None when all are held, or when the database does not answer (then no session is opened)."""
        checkout = self.db.connection(timeout=CONNECTION_TIMEOUT_SECONDS)
        try:
            conn = checkout.__enter__()
        except Exception as exc:
            log.warning("slots.unavailable", destination_id=destination_id, error=type(exc).__name__)
            return None
        try:
            for slot in random.sample(range(max_sessions), max_sessions):
                if partner.try_slot(conn, destination_id=destination_id, slot=slot):
                    return HeldSlot(checkout, conn, destination_id, slot)
        except Exception as exc:
            log.warning("slots.unavailable", destination_id=destination_id, error=type(exc).__name__)
            conn.close()
        checkout.__exit__(None, None, None)
        return None
