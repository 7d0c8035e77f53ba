"""What the worker reads around its writes, one function per statement in ``sql/worker.sql``.

The message is a hint: every decision starts from these reads of the row.
"""

from __future__ import annotations

import select
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg import pq, sql

from app.store import connector
from app.store.partner import Circuit
from app.store.types import ExpectedFile, Status

#: The destination columns ``worker_read_job`` reads, as ``DestinationConfig.from_row`` names them.
DESTINATION_COLUMNS = ("host", "port", "username", "remote_dir", "host_key", "credential_ref", "remote_hash",
                       "acknowledgments", "name_and_size_identify", "read_back", "active", "max_sessions",
                       "auto_retries", "more_host_keys", "delivery_mode", "bandwidth_limit")


@dataclass(frozen=True)
class JobView:
    """The job as the runner needs it, with what it decides on before its claim."""

    id: UUID
    tenant_id: UUID
    status: Status
    version: int
    destination_id: UUID
    delivery_key: str
    #: The partner-facing name the key delivers under, rendered when the original was created.
    file_name: str
    replaces_job_id: UUID | None
    overwrite_agreement_ref: str | None
    #: How often the job was deferred, and seconds since its first deferral (None: never deferred).
    deferrals: int
    deferred_for_seconds: float | None
    last_deferral: str | None
    #: The destination's row (``DestinationConfig.from_row`` reads it), None when it is not the tenant's.
    destination: dict[str, Any] | None = field(default=None, compare=False)
    circuit: Circuit = field(default_factory=Circuit.closed, compare=False)
    #: A replacement's original's expected file; None for an original job, or an original that never
    #: reached cutoff 2 (then nothing can identify a file as its delivery).
    original_expected: ExpectedFile | None = None
    #: The destination's current delivery profile and its version (None when the destination is not found).
    profile: dict[str, Any] | None = field(default=None, compare=False)
    profile_version: int | None = None
    #: An incremental export sends the contacts changed since this snapshot (None: its schedule's first run).
    incremental: bool = False
    incremental_since: str | None = None
    #: Why it must wait unclaimed: ``tenant paused``, ``destination paused`` or ``destination draining``.
    held: str | None = None


def read_job(conn: psycopg.Connection, job_id: UUID) -> JobView | None:
    row = connector.fetch_one(conn, "worker_read_job", dict(job_id=job_id))
    if row is None:
        return None
    destination = None
    if row["destination_found"] is not None:
        destination = {"id": row["destination_id"], "tenant_id": row["tenant_id"],
                       **{name: row[name] for name in DESTINATION_COLUMNS}}
    original = None
    if row["original_file_name"] is not None and row["original_file_sha256"] is not None:
        original = ExpectedFile(row["original_file_name"], row["original_file_bytes"],
                                bytes(row["original_file_sha256"]))
    return JobView(id=row["id"], tenant_id=row["tenant_id"], status=Status(row["status"]), version=row["version"],
                   destination_id=row["destination_id"], delivery_key=row["delivery_key"], file_name=row["file_name"],
                   replaces_job_id=row["replaces_job_id"], overwrite_agreement_ref=row["overwrite_agreement_ref"],
                   deferrals=row["deferrals"], last_deferral=row["last_deferral"],
                   deferred_for_seconds=None if row["deferred_for_seconds"] is None
                   else float(row["deferred_for_seconds"]),
                   destination=destination,
                   circuit=Circuit.from_row(row["circuit_state"], row["circuit_failures"], row["circuit_last_error"],
                                            row["circuit_probe_in_seconds"], row["circuit_probe_held"]),
                   original_expected=original, profile=row["profile"], profile_version=row["profile_version"],
                   incremental=row["incremental"], incremental_since=row["incremental_since"], held=row["held"])


def confirm_stops(conn: psycopg.Connection, watched: dict[UUID, UUID]) -> list[UUID]:
    """Of the watched ``{job_id: attempt_id}``, the jobs whose attempt has a recorded stop request."""
    rows = connector.fetch_all(conn, "worker_confirm_stops",
                               dict(job_ids=list(watched), attempt_ids=list(watched.values())))
    return [r["id"] for r in rows]


#: An incremental export's last column, and what it says of each contact.
CHANGE_COLUMN, UPSERT, DELETE = "_change", "upsert", "delete"
#: The contact fields a copy may name (the only identifiers it composes from outside).
CONTACT_COLUMNS = ("email", "full_name", "company", "phone")
#: Cells OWASP's CSV-injection guidance says a spreadsheet may evaluate: prefixed with a quote, they are text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: A quote and a delimiter JSON text never holds unescaped (it escapes every control character).
_JSON_QUOTE, _JSON_DELIMITER = "\x01", "\x02"


@dataclass(frozen=True)
class ContactsCopy:
    """How PostgreSQL writes the partner's rows; the header, line endings and compression are the builder's."""

    #: Each column's source: a name from ``CONTACT_COLUMNS``, or ``("attributes", name)`` for a custom field.
    columns: tuple[str | tuple[str, str], ...] = CONTACT_COLUMNS
    #: Keys of a JSON Lines object, one per column; None: CSV.
    json_keys: tuple[str, ...] | None = None
    delimiter: str = ","
    quote_all: bool = False
    neutralize_formulas: bool = False
    #: An incremental export's last column (key ``_change``): ``upsert``, or ``delete`` for withdrawn consent.
    change_column: bool = False

    def parts(self, limit: int | None = None) -> dict[str, sql.Composable]:
        """What ``worker_copy_consenting_contacts`` leaves open, composed: columns, options, limit."""
        values = [self._value(source) for source in self.columns]
        if self.change_column:
            values.append(sql.SQL("CASE WHEN consent THEN {} ELSE {} END").format(sql.Literal(UPSERT),
                                                                                 sql.Literal(DELETE)))
        limited = sql.SQL("") if limit is None else sql.SQL("LIMIT {}").format(sql.Literal(int(limit)))
        if self.json_keys is not None:
            # json (not jsonb) keeps the columns' order, and null stays null. Written as CSV with a quote and
            # a delimiter JSON never holds, no line is ever quoted: each is the object's text as it is.
            keys = (*self.json_keys, CHANGE_COLUMN) if self.change_column else self.json_keys
            columns = sql.SQL("json_object(ARRAY[{}]::text[], ARRAY[{}]::text[])::text").format(
                sql.SQL(", ").join(sql.Literal(key) for key in keys), sql.SQL(", ").join(values))
            options = sql.SQL("FORMAT csv, QUOTE {}, DELIMITER {}, ENCODING 'UTF8'").format(
                sql.Literal(_JSON_QUOTE), sql.Literal(_JSON_DELIMITER))
            return {"columns": columns, "options": options, "limit": limited}
        options = sql.SQL("FORMAT csv, DELIMITER {}, ENCODING 'UTF8'{}").format(
            sql.Literal(self.delimiter), sql.SQL(", FORCE_QUOTE *") if self.quote_all else sql.SQL(""))
        return {"columns": sql.SQL(", ").join(values), "options": options, "limit": limited}

    def _value(self, source: str | tuple[str, str]) -> sql.Composable:
        if isinstance(source, tuple):
            value: sql.Composable = sql.SQL("(attributes ->> {})").format(sql.Literal(source[1]))
        elif source in CONTACT_COLUMNS:
            value = sql.Identifier(source)
        else:
            raise ValueError(f"not a contact column: {source!r}")
        if not self.neutralize_formulas:
            return value
        starts = sql.SQL(", ").join(sql.Literal(c) for c in _FORMULA_STARTS)
        return sql.SQL("CASE WHEN left({v}, 1) IN ({starts}) THEN {quote} || {v} ELSE {v} END").format(
            v=value, starts=starts, quote=sql.Literal("'"))


@contextmanager
def consenting_contacts(conn: psycopg.Connection, tenant_id: UUID, shape: ContactsCopy, block_bytes: int,
                        limit: int | None = None) -> Iterator[Iterator[tuple[bytearray, int]]]:
    """The tenant's consenting contacts as ``shape`` says, written by PostgreSQL itself, in blocks of at
    least ``block_bytes`` (the last one shorter), each cut at the end of a row and given with how many
    rows it holds, the first ``limit`` rows only when given. Raises the server's error, a cancellation's
    too, when the COPY fails part way."""
    with connector.copy(conn, "worker_copy_consenting_contacts", dict(tenant_id=tenant_id),
                        parts=shape.parts(limit)):
        yield _copy_out_blocks(conn, block_bytes)


@contextmanager
def changed_contacts(conn: psycopg.Connection, tenant_id: UUID, since: str | None, shape: ContactsCopy,
                     block_bytes: int, limit: int | None = None) -> Iterator[Iterator[tuple[bytearray, int]]]:
    """An incremental export's rows (``worker_copy_changed_contacts``), in blocks as ``consenting_contacts``
    gives them; run inside the transaction ``begin_snapshot`` opened."""
    with connector.copy(conn, "worker_copy_changed_contacts", dict(tenant_id=tenant_id, since=since),
                        parts=shape.parts(limit)):
        yield _copy_out_blocks(conn, block_bytes)


def begin_snapshot(conn: psycopg.Connection) -> str:
    """Makes the open transaction REPEATABLE READ and read-only, and answers its snapshot (pg_snapshot's
    text): what every later statement of the transaction reads."""
    connector.execute(conn, "worker_begin_snapshot")
    row = connector.fetch_one(conn, "worker_read_snapshot")
    assert row is not None
    return str(row["snapshot"])


def _copy_out_blocks(conn: psycopg.Connection, block_bytes: int) -> Iterator[tuple[bytearray, int]]:
    # PostgreSQL sends COPY out one message per row, and psycopg's Copy.read() spends a wait and two
    # generators on each: at 60-byte contacts that was half the builder's time. libpq, asked without
    # waiting, hands out the rows it already holds; only when it holds none does this wait for the
    # socket. A cancellation ends the COPY as its last row does, with the error as its result; a lost
    # connection raises from consume_input.
    pgconn = conn.pgconn
    readable = select.poll()
    readable.register(pgconn.socket, select.POLLIN)
    block = bytearray()
    rows = 0
    while True:
        nbytes, row = pgconn.get_copy_data(1)
        if nbytes > 0:
            block += row
            rows += 1
            if len(block) >= block_bytes:
                yield block, rows
                block, rows = bytearray(), 0
        elif nbytes == 0:
            readable.poll()
            pgconn.consume_input()
        else:
            break
    _finish_copy_out(conn, readable)
    if block:
        yield block, rows


def _finish_copy_out(conn: psycopg.Connection, readable: select.poll) -> None:
    """Takes the COPY's results, leaving the connection idle, as psycopg's own reader does at the end;
    raises the first failed one as psycopg would have."""
    pgconn = conn.pgconn
    failure: psycopg.Error | None = None
    while True:
        while pgconn.is_busy():
            readable.poll()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        if result.status != pq.ExecStatus.COMMAND_OK and failure is None:
            failure = psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    if failure is not None:
        raise failure
