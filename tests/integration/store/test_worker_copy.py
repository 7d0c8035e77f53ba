"""The contacts COPY reader (``worker.consenting_contacts``): PostgreSQL's own CSV, byte for byte,
in blocks cut at row ends; a COPY that fails part way raises the server's error and leaves the
connection idle for the next user of the pool."""

from __future__ import annotations

import csv
import io
import json
import threading

import psycopg
import pytest
from psycopg import errors as pg

from app.store import connector, errors
from app.store import worker as worker_reads

#: Fields COPY's CSV must quote (a delimiter, a quote, line breaks), backslashes (no escape in CSV),
#: non-ASCII text, the empty string, which COPY quotes to tell it from NULL, and NULL.
AWKWARD = [
    ("plain@example.com", "Plain Name", "Acme", "+1-555-0100"),
    ("quote@example.com", 'Say "hi"', '"Quoted" Co', None),
    ("comma@example.com", "Last, First", "Acme, Inc.", "1,2"),
    ("newline@example.com", "Line one\nLine two", "CR\r\nLF", ""),
    ("unicode@example.com", "Zoë Ångström 山田太郎", "Société générale ✓", "☎ 555"),
    ("backslash@example.com", "back\\slash", "\\.", " leading and trailing "),
]


@pytest.fixture
def tenant(seed, conn):
    tenant = seed.tenant()
    rows = [(f"{i}-{email}", name, company, phone) for i in range(400) for email, name, company, phone in AWKWARD]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO contacts (tenant_id, email, full_name, company, phone, consent)"
                        " VALUES (%s, %s, %s, %s, %s, true)", [(tenant, *row) for row in rows])
    return tenant, rows


def _row_by_row(conn: psycopg.Connection, tenant_id) -> bytes:
    """The same statement read as psycopg hands COPY out, one row per read: what the builder wrote before."""
    with connector.copy(conn, "worker_copy_consenting_contacts", dict(tenant_id=tenant_id),
                        parts=worker_reads.ContactsCopy().parts()) as copied:
        return b"".join(bytes(row) for row in copied)


def test_the_blocks_join_to_exactly_the_bytes_psycopg_reads_row_by_row_and_parse_back_to_the_contacts(
        conn, tenant):
    tenant_id, rows = tenant
    with worker_reads.consenting_contacts(conn, tenant_id, worker_reads.ContactsCopy(), 1000) as blocks:
        got, counts = zip(*[(bytes(block), n) for block, n in blocks], strict=True)

    assert b"".join(got) == _row_by_row(conn, tenant_id)
    parsed = list(csv.reader(io.StringIO(b"".join(got).decode("utf-8"), newline="")))
    # csv reads NULL and "" alike; the bytes above tell them apart.
    assert parsed == [[e, n, c, p or ""] for e, n, c, p in rows]
    assert sum(counts) == len(rows)
    assert len(got) > 100 and all(len(block) >= 1000 for block in got[:-1])
    # Cut at row ends: each block parses on its own into whole rows, which add up to the file's.
    assert [row for block in got for row in csv.reader(io.StringIO(block.decode("utf-8"), newline=""))] == parsed
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


def test_quotes_line_breaks_and_empty_strings_are_quoted_and_a_null_and_backslashes_left_alone(conn, tenant):
    tenant_id, _ = tenant
    with worker_reads.consenting_contacts(conn, tenant_id, worker_reads.ContactsCopy(), 1 << 20) as blocks:
        data = b"".join(block for block, _rows in blocks)

    lines = data.split(b"\n")
    assert b'1-quote@example.com,"Say ""hi""","""Quoted"" Co",' in lines
    assert b'1-newline@example.com,"Line one' in lines and b'Line two","CR\r' in lines and b'LF",""' in lines
    assert b'1-backslash@example.com,back\\slash,\\., leading and trailing ' in lines   # CSV has no escapes
    assert "1-unicode@example.com,Zoë Ångström 山田太郎,Société générale ✓,☎ 555".encode() in lines


def test_a_cancel_while_rows_stream_raises_query_canceled_and_leaves_the_connection_idle(conn, admin, tenant):
    tenant_id, _ = tenant
    _more_than_the_socket_buffers_hold(admin, tenant_id)
    backend = conn.info.backend_pid

    with pytest.raises(pg.QueryCanceled):
        with worker_reads.consenting_contacts(conn, tenant_id, worker_reads.ContactsCopy(), 64 * 1024) as blocks:
            for index, _block in enumerate(blocks):
                if index == 0:
                    assert _state(admin, backend) == "active"
                    conn.cancel_safe(timeout=5)

    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_a_backend_terminated_while_rows_stream_raises_a_connection_error(conn, admin, tenant):
    tenant_id, _ = tenant
    _more_than_the_socket_buffers_hold(admin, tenant_id)
    backend = conn.info.backend_pid
    terminated = threading.Event()

    with pytest.raises(psycopg.OperationalError) as raised:
        with worker_reads.consenting_contacts(conn, tenant_id, worker_reads.ContactsCopy(), 64 * 1024) as blocks:
            for _block in blocks:
                if not terminated.is_set():
                    assert _state(admin, backend) == "active"
                    assert admin.execute("SELECT pg_terminate_backend(%s) AS t", (backend,)).fetchone()["t"]
                    terminated.set()

    # Either the server's farewell (AdminShutdown) or the closed socket, depending on which is read
    # first: both are transient to the builder, which tries again on a fresh connection.
    assert errors.transient(raised.value)


def _more_than_the_socket_buffers_hold(admin: psycopg.Connection, tenant_id) -> None:
    """About 48 MB of CSV in 6,000 long rows, so the COPY is still sending when the test acts."""
    admin.execute("INSERT INTO contacts (tenant_id, email, full_name, company, phone, consent)"
                  " SELECT %s, 'bulk' || i || '@example.com', repeat(md5(i::text), 256), 'Company', NULL, true"
                  " FROM generate_series(1, 6000) i", (tenant_id,))


def _state(admin: psycopg.Connection, pid: int) -> str:
    return admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()["state"]


# --- the profile's shapes: what PostgreSQL writes for each -----------------------------------------


def _copied(conn, tenant_id, shape: worker_reads.ContactsCopy, limit: int | None = None) -> bytes:
    with worker_reads.consenting_contacts(conn, tenant_id, shape, 1 << 20, limit=limit) as blocks:
        return b"".join(block for block, _rows in blocks)


def test_neutralising_prefixes_a_quote_to_every_cell_a_spreadsheet_would_evaluate_tab_and_cr_included(seed, conn):
    tenant_id = seed.tenant()
    cells = ["=1+1", "+cmd", "-2", "@SUM(A1)", "\tTab", "\rCR", "plain", "a=b", " =space first"]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO contacts (tenant_id, email, full_name, consent, attributes)"
                        " VALUES (%s, %s, %s, true, jsonb_build_object('note', %s::text))",
                        [(tenant_id, f"{i}@example.com", cell, cell) for i, cell in enumerate(cells)])
    shape = worker_reads.ContactsCopy(("full_name", ("attributes", "note")), neutralize_formulas=True)

    parsed = list(csv.reader(io.StringIO(_copied(conn, tenant_id, shape).decode(), newline="")))

    expected = ["'" + c if c[0] in "=+-@\t\r" else c for c in cells]
    assert parsed == [[c, c] for c in expected]


def test_json_lines_are_objects_in_the_profiles_key_order_with_null_for_a_missing_field_and_never_quoted(seed, conn):
    tenant_id = seed.tenant()
    conn.execute("INSERT INTO contacts (tenant_id, email, full_name, company, consent, attributes) VALUES"
                 " (%s, 'a@example.com', 'Line\nbreak \"q\" \\ \x01', NULL, true, '{\"tier\": \"gold\"}'),"
                 " (%s, 'b@example.com', 'B', 'Co', true, '{}')", (tenant_id, tenant_id))
    shape = worker_reads.ContactsCopy(("email", ("attributes", "tier"), "full_name", "company"),
                                      json_keys=("Email", "Tier", "Name", "company"))

    data = _copied(conn, tenant_id, shape)

    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert [json.loads(line) for line in lines[:-1]] == [
        {"Email": "a@example.com", "Tier": "gold", "Name": "Line\nbreak \"q\" \\ \x01", "company": None},
        {"Email": "b@example.com", "Tier": None, "Name": "B", "company": "Co"}]
    assert list(json.loads(lines[0])) == ["Email", "Tier", "Name", "company"]


def test_quoting_all_quotes_every_non_null_field_and_a_limit_stops_after_that_many_rows(conn, tenant):
    tenant_id, rows = tenant

    data = _copied(conn, tenant_id, worker_reads.ContactsCopy(quote_all=True, delimiter="|"), limit=3)

    assert data.split(b"\n")[:3] == [b'"0-plain@example.com"|"Plain Name"|"Acme"|"+1-555-0100"',
                                     b'"0-quote@example.com"|"Say ""hi"""|"""Quoted"" Co"|',
                                     b'"0-comma@example.com"|"Last, First"|"Acme, Inc."|"1,2"']
    assert len(list(csv.reader(io.StringIO(data.decode(), newline=""), delimiter="|"))) == 3


def test_a_column_that_is_not_a_contact_field_is_never_composed_into_the_statement():
    with pytest.raises(ValueError, match="not a contact column"):
        worker_reads.ContactsCopy(("email", "password")).parts()
