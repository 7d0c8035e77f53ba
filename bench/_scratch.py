"""A migrated scratch database and a bench tenant, shared by the database benchmarks."""

from __future__ import annotations

import os
import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from app.store.migrate import migrate

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def base_url() -> str:
    return os.environ.get("EXPORTS_BENCH_DATABASE_URL") or DEFAULT_URL


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
        "INSERT INTO destinations (id, tenant_id, name, host, port, username, remote_dir, host_key, credential_ref)"
        " VALUES (%s, %s, 'bench', '127.0.0.1', 22, 'u', '/inbox', %s, 'env:X')", (destination, tenant, host_key))
    return tenant, destination
