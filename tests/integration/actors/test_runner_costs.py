"""What one export costs the database in the worker: every statement the runner's thread sends (the
runner, its builder, its session slots, the delivery), counted at psycopg, and the transactions they
make (an autocommit statement outside a transaction block is one; a block is one). A warm worker's
export is counted, its session to the partner kept from the export before, as under load. The lease
keeper's renewals and the stop watcher's polls run on their own threads, by the clock rather than per
export (one poll covers every attempt of the process), and are not counted here.

The list is the protocol's own: the job read, the claim (cutoff 1, with its event), the build's COPY,
cutoff 2 (with its event and the baseline evidence), and the terminal write (with its event and the
delivery's evidence). A new statement on this path fails here until it is counted on purpose."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from app.actors.runner import RunOutcome
from app.actors.slots import DatabaseSlots
from app.delivery.sessions import SessionPool
from app.store.database import Database
from app.store.types import Role, WriteResult

_NAME = re.compile(r"^\s*/\*\s*(\w+)\s*\*/")


@dataclass
class Sent:
    statements: list[str] = field(default_factory=list)
    transactions: int = 0

    thread: int = field(default_factory=threading.get_ident)

    def record(self, conn: psycopg.Connection, query: object) -> None:
        if threading.get_ident() != self.thread:
            return
        text = query.as_string(conn) if hasattr(query, "as_string") else str(query)
        match = _NAME.match(text if isinstance(text, str) else text.decode())
        self.statements.append(match.group(1) if match else text.split()[0].upper())
        if conn.info.transaction_status is TransactionStatus.IDLE and conn.autocommit:
            self.transactions += 1


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    sent = Sent()
    # Connection.execute runs a cursor's: counted there, once.
    real_cursor_execute = psycopg.Cursor.execute
    real_copy, real_transaction = psycopg.Cursor.copy, psycopg.Connection.transaction

    def cursor_execute(self, query, params=None, **kwargs):
        sent.record(self.connection, query)
        return real_cursor_execute(self, query, params, **kwargs)

    def copy(self, statement, params=None, **kwargs):
        sent.record(self.connection, statement)
        return real_copy(self, statement, params, **kwargs)

    def transaction(self, *args, **kwargs):
        if self.info.transaction_status is TransactionStatus.IDLE and threading.get_ident() == sent.thread:
            sent.transactions += 1
            # The statements inside are the block's: none of them counts as a transaction of its own.
        return real_transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", cursor_execute)
    monkeypatch.setattr(psycopg.Cursor, "copy", copy)
    monkeypatch.setattr(psycopg.Connection, "transaction", transaction)
    yield sent


def test_a_warm_workers_export_costs_five_statements_in_five_transactions(worker, db_url, monkeypatch):
    slots_db = Database(db_url, Role.APP, min_size=0, max_size=4, name="exports-slots")
    try:
        runner = worker.runner(sessions=SessionPool(DatabaseSlots(slots_db)), listen=False)
        warm_up = worker.queued()
        assert runner.run(warm_up.id).outcome is RunOutcome.DELIVERED   # connections open, session kept
        job = worker.queued()

        with counting(monkeypatch) as sent:
            result = runner.run(job.id)

        assert (result.outcome, result.write) == (RunOutcome.DELIVERED, WriteResult.WRITTEN)
        assert sent.statements == ["worker_read_job", "export_claim", "worker_copy_consenting_contacts",
                                   "export_authorize_delivery", "export_finish_delivery"]
        # Three of them write (each a transition with its event, and evidence where it has some): the
        # reference's minimum, one per cutoff and one terminal write.
        assert sent.transactions == 5
    finally:
        slots_db.close()
