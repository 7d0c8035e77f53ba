"""The builder's rate and memory against psql writing the same CSV with the same COPY.

Builds a tenant's consenting contacts at two sizes. The ceiling is psql's \\copy of the very same
query to a file, timed in the same run; the memory figure is the builder's peak Python allocation
(tracemalloc), which must stay flat as the contact count grows tenfold.

    python -m bench.build_export [--contacts 20000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from app.actors.builder import ContactsBuilder
from app.actors.policy import Scope
from app.actors.stop import StopSignal
from bench._scratch import base_url, create, drop


def seed(conn: psycopg.Connection, count: int) -> uuid.UUID:
    tenant = uuid.uuid4()
    conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 'bench')", (tenant,))
    conn.execute(
        "INSERT INTO contacts (tenant_id, email, full_name, company, phone, consent)"
        " SELECT %s, 'person' || i || '@example.com', 'Person ' || i, 'Company ' || (i %% 97),"
        " '+1 555 ' || lpad(i::text, 7, '0'), i %% 10 <> 0 FROM generate_series(1, %s) i",
        (tenant, count))
    conn.execute("VACUUM ANALYZE contacts")
    return tenant


def build(url: str, work_dir: Path, tenant: uuid.UUID, *, trace: bool) -> tuple[float, int, int]:
    """Timed without tracemalloc (it slows every allocation), measured for memory with it."""
    builder = ContactsBuilder(url, work_dir)
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    built = builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant,
                          scope=Scope.CONSENTING_CONTACTS, stop=StopSignal())
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if trace else 0
    tracemalloc.stop()
    built.delete()
    return elapsed, built.size, peak


def psql_copy(url: str, work_dir: Path, tenant: uuid.UUID) -> float:
    params = conninfo_to_dict(url)
    query = ("\\copy (SELECT email, full_name, company, phone FROM contacts WHERE tenant_id = "
             f"'{tenant}' AND consent ORDER BY id) TO '{work_dir / 'psql.csv'}' WITH (FORMAT csv, HEADER true)")
    started = time.perf_counter()
    subprocess.run(["psql", "-q", "-h", params.get("host", "127.0.0.1"), "-p", str(params.get("port", 5432)),
                    "-U", params.get("user", "postgres"), "-d", params["dbname"], "-c", query], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contacts", type=int, default=20000, help="the smaller size; the larger is ten times it")
    args = parser.parse_args()
    base = base_url()
    name = f"exports_bench_build_{os.getpid()}"
    url = create(base, name)
    print("builder vs psql \\copy of the same query (best of 2 each):")
    with psycopg.connect(url, autocommit=True) as owner, tempfile.TemporaryDirectory() as tmp:
        work_dir = Path(tmp)
        for count in (args.contacts, args.contacts * 10):
            tenant = seed(owner, count)
            elapsed, size, _ = min(build(url, work_dir, tenant, trace=False) for _ in range(2))
            peak = build(url, work_dir, tenant, trace=True)[2]
            ceiling = min(psql_copy(url, work_dir, tenant) for _ in range(2))
            print(f"  {count:>8} contacts, {size / 1e6:6.1f} MB: builder {elapsed:6.2f} s, psql {ceiling:6.2f} s,"
                  f" ratio {ceiling / elapsed:4.2f}; builder peak Python memory {peak / 1024:7.0f} KiB")
    drop(base, name)


if __name__ == "__main__":
    main()
