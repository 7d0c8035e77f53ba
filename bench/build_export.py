"""The builder against the ways PostgreSQL can write the same CSV with the same COPY.

The builder (``ContactsBuilder``: COPY TO STDOUT, written in 256 KiB chunks, hashed with SHA-256 and
fsync'ed) against, at the same size and on the same tenant:

- psql's ``\\copy`` of the same query with the same options into a file: the client a DBA would use.
  Its start-up (process, connection) is timed on its own: at a million contacts it is a rounding error,
  at a few thousand it was most of the figure.
- server-side ``COPY ... TO 'file'`` (superuser, the server on this machine): PostgreSQL writing the
  file itself, no client and no socket, the floor of any client.
- ``COPY TO STDOUT`` read by a bare psycopg loop into a file (no hash, no fsync): the least any
  Python client can do.

    python -m bench.build_export [--contacts 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from app.actors.builder import ContactsBuilder
from app.actors.policy import Scope
from app.actors.stop import StopSignal
from bench._scratch import base_url, create, drop

#: The product's query and options (app/store/sql/worker.sql, worker_copy_consenting_contacts).
QUERY = ("SELECT email, full_name, company, phone FROM contacts WHERE tenant_id = {tenant} AND consent "
         "ORDER BY id")
OPTIONS = "(FORMAT csv, HEADER true, ENCODING 'UTF8')"


def seed(conn: psycopg.Connection, count: int) -> uuid.UUID:
    """A tenant with ``count`` contacts, nine in ten consenting (a million: a 59 MiB export)."""
    tenant = uuid.uuid4()
    conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 'bench')", (tenant,))
    conn.execute(
        "INSERT INTO contacts (tenant_id, email, full_name, company, phone, consent)"
        " SELECT %s, 'person' || i || '@example.com', 'Person ' || i, 'Company ' || (i %% 97),"
        " '+1 555 ' || lpad(i::text, 7, '0'), i %% 10 <> 0 FROM generate_series(1, %s) i",
        (tenant, count))
    conn.execute("VACUUM ANALYZE contacts")
    return tenant


def build(builder: ContactsBuilder, tenant: uuid.UUID, *, trace: bool = False) -> tuple[float, int, int, bytes]:
    """One build; (seconds, bytes, peak Python memory or 0, sha256). Timed without tracemalloc (it slows
    every allocation), measured for memory with it."""
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    built = builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant,
                          scope=Scope.CONSENTING_CONTACTS, stop=StopSignal())
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    tracemalloc.stop()
    built.delete()
    return elapsed, built.size, peak, built.sha256


def _query(tenant: uuid.UUID) -> str:
    return QUERY.format(tenant=f"'{tenant}'")


def _psql(url: str) -> list[str]:
    params = conninfo_to_dict(url)
    return ["psql", "-q", "-X", "-h", str(params.get("host") or "127.0.0.1"), "-p", str(params.get("port") or 5432),
            "-U", str(params.get("user") or "postgres"), "-d", str(params["dbname"])]


def psql_copy(url: str, out: Path, tenant: uuid.UUID) -> float:
    """Seconds for psql to ``\\copy`` the export into ``out``, start-up included."""
    command = f"\\copy ({_query(tenant)}) TO '{out}' WITH {OPTIONS}"
    started = time.perf_counter()
    subprocess.run([*_psql(url), "-c", command], check=True)
    return time.perf_counter() - started


def psql_startup(url: str) -> float:
    """Seconds for psql to start, connect, run ``SELECT 1`` and exit."""
    started = time.perf_counter()
    subprocess.run([*_psql(url), "-Atc", "SELECT 1"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


@contextlib.contextmanager
def server_directory() -> Iterator[Path]:
    """A directory the PostgreSQL server's own user can write into (under /tmp, whose parents it can reach)."""
    path = Path(tempfile.mkdtemp(prefix="exports-bench-server-copy-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def server_copy(url: str, out: Path, tenant: uuid.UUID) -> float:
    """Seconds for the server to COPY the export into ``out`` itself (needs a superuser and a local server)."""
    statement = sql.SQL("COPY ({}) TO {} WITH " + OPTIONS).format(
        sql.SQL(QUERY).format(tenant=sql.Literal(str(tenant))), sql.Literal(str(out)))
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(statement)
        return time.perf_counter() - started


def psycopg_loop(url: str, out: Path, tenant: uuid.UUID) -> float:
    """Seconds for a bare psycopg loop to read COPY TO STDOUT into ``out`` (no hash, no fsync), on an open
    connection."""
    statement = sql.SQL("COPY ({}) TO STDOUT WITH " + OPTIONS).format(
        sql.SQL(QUERY).format(tenant=sql.Literal(str(tenant))))
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy(statement) as copy, out.open("wb") as target:
            for block in copy:
                target.write(block)
        return time.perf_counter() - started


def sha256_of(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contacts", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = base_url()
    name = f"exports_bench_build_{os.getpid()}"
    url = create(base, name)
    try:
        with psycopg.connect(url, autocommit=True) as owner, tempfile.TemporaryDirectory() as tmp, \
                server_directory() as served:
            work = Path(tmp)
            tenant = seed(owner, args.contacts)
            builder = ContactsBuilder(url, work)
            _, size, _, _ = build(builder, tenant)   # warm-up
            ours = min(build(builder, tenant)[0] for _ in range(args.runs))
            psql = min(psql_copy(url, work / "psql.csv", tenant) for _ in range(args.runs))
            startup = min(psql_startup(url) for _ in range(args.runs))
            loop = min(psycopg_loop(url, work / "loop.csv", tenant) for _ in range(args.runs))
            server = min(server_copy(url, served / "server.csv", tenant) for _ in range(args.runs))
            peak = build(builder, tenant, trace=True)[2]
            builder.close()
        mib = size / 2**20
        print(f"{args.contacts:,} contacts, {mib:.1f} MiB (best of {args.runs}):")
        for label, seconds in (("builder", ours), ("psql \\copy", psql), ("bare psycopg loop", loop),
                               ("server-side COPY to a file", server)):
            print(f"  {label:28s} {seconds:6.2f} s  {mib / seconds:6.1f} MiB/s  builder/this {seconds / ours:4.2f}")
        print(f"  psql start-up {startup * 1000:.0f} ms; builder peak Python memory {peak / 1024:.0f} KiB")
    finally:
        drop(base, name)


if __name__ == "__main__":
    main()
