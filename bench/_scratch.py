"""A migrated scratch database and a bench tenant, shared by the database benchmarks."""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from app.store.migrate import migrate

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Where the bench's own PostgreSQL lives on a machine without one (``make bench`` on a fresh laptop).
EMBEDDED_DIR = Path("var/bench-pg")


@functools.cache
def base_url() -> str:
    """EXPORTS_BENCH_DATABASE_URL, else the local PostgreSQL at 5432, else an embedded one (pgserver,
    the same binaries the product's embedded default runs), whose pgbench and psql then come first on
    PATH so the ceilings run against the same server."""
    configured = os.environ.get("EXPORTS_BENCH_DATABASE_URL")
    if configured:
        return configured
    try:
        psycopg.connect(DEFAULT_URL, connect_timeout=3).close()
        return DEFAULT_URL
    except psycopg.OperationalError:
        pass
    import warnings

    import pgserver
    from pgserver.postgres_server import POSTGRES_BIN_PATH

    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    EMBEDDED_DIR.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(EMBEDDED_DIR.resolve(), cleanup_mode="stop")
    os.environ["PATH"] = f"{POSTGRES_BIN_PATH}{os.pathsep}{os.environ.get('PATH', '')}"
    return server.get_uri()


def create(base: str, name: str) -> str:
    """(Re)creates and migrates database ``name`` on ``base``'s server; returns its URL."""
    drop(base, name)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(base, dbname=name)
    migrate(url)
    return url


def drop(base: str, name: str) -> None:
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def tenant_with_destination(owner: psycopg.Connection, *, host_key: str = "x") -> tuple[uuid.UUID, uuid.UUID]:
    """A tenant and one destination of its own, written as the owner: benchmarks measure other writes."""
    tenant, destination = uuid.uuid4(), uuid.uuid4()
    owner.execute("INSERT INTO tenants (id, name) VALUES (%s, 'bench')", (tenant,))
    owner.execute(
        "WITH d AS (INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir, host_key,"
        " credential_ref) VALUES (%s, %s, 'bench', '127.0.0.1', 22, 'u', '/inbox', %s, 'env:X') RETURNING id)"
        " INSERT INTO delivery_profiles (destination_id, version, profile, created_by)"
        " SELECT id, 1, '{}', 'bench' FROM d", (destination, tenant, host_key))
    return tenant, destination
