"""Tenants, destinations, operator access and contacts: the rows an export needs before it exists.

One function per named statement in ``sql/directory.sql``, the connection first, a typed answer.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg

from app.store import connector, errors
from app.store.errors import StoreError, Violation


@dataclass(frozen=True)
class NewDestination:
    tenant_id: UUID
    name: str
    host: str
    port: int
    username: str
    remote_dir: str
    #: One known_hosts line, pinned.
    host_key: str
    #: ``env:NAME``, ``keyfile:/path`` or ``env-keyfile:NAME``: where the secret is, never the secret.
    credential_ref: str
    remote_hash: bool = False
    acknowledgments: bool = False
    name_and_size_identify: bool = False
    read_back: bool = False
    #: Sessions the partner allows at once, over every worker host.
    max_sessions: int = 4
    #: Automatic retries of a proven non-delivery per delivery key; 0: off.
    auto_retries: int = 3


@dataclass(frozen=True)
class NewContact:
    email: str
    full_name: str
    company: str | None
    phone: str | None
    consent: bool
    #: The tenant's custom fields, by name (``contacts.attributes``).
    attributes: Mapping[str, str] = field(default_factory=dict)


class AddResult(enum.Enum):
    ADDED = "Added"
    UNKNOWN_TENANT = "UnknownTenant"


class GrantResult(enum.Enum):
    GRANTED = "Granted"
    ALREADY_GRANTED = "AlreadyGranted"   # the pair exists; nothing changed (its reconciliation flag included)
    UNKNOWN_TENANT = "UnknownTenant"


def add_tenant(conn: psycopg.Connection, *, tenant_id: UUID, name: str) -> None:
    rows = connector.execute(conn, "directory_add_tenant", dict(tenant_id=tenant_id, name=name))
    if rows != 1:
        raise StoreError(f"directory_add_tenant wrote {rows} rows")


def add_destination(conn: psycopg.Connection, *, destination_id: UUID, destination: NewDestination) -> AddResult:
    params = dict(destination_id=destination_id, **destination.__dict__)
    try:
        rows = connector.execute(conn, "directory_add_destination", params)
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is Violation.UNKNOWN_TENANT:
            return AddResult.UNKNOWN_TENANT
        raise
    if rows != 1:
        raise StoreError(f"directory_add_destination wrote {rows} rows")
    return AddResult.ADDED


def grant_operator(conn: psycopg.Connection, *, operator_id: str, tenant_id: UUID, reconciliation: bool) -> GrantResult:
    try:
        rows = connector.execute(conn, "directory_grant_operator", dict(
            operator_id=operator_id, tenant_id=tenant_id, reconciliation=reconciliation))
    except psycopg.IntegrityError as exc:
        if errors.violation(exc) is Violation.UNKNOWN_TENANT:
            return GrantResult.UNKNOWN_TENANT
        raise
    return GrantResult.GRANTED if rows == 1 else GrantResult.ALREADY_GRANTED


def copy_contacts(conn: psycopg.Connection, *, tenant_id: UUID, contacts: Iterable[NewContact]) -> int:
    """Loads every contact or none (one transaction); returns how many were loaded. Raises
    ``ForeignKeyViolation`` for an unknown tenant, with nothing loaded."""
    count = 0
    with conn.transaction(), connector.copy(conn, "directory_copy_contacts") as copy:
        for contact in contacts:
            copy.write_row((tenant_id, contact.email, contact.full_name, contact.company, contact.phone,
                            contact.consent, json.dumps(dict(contact.attributes))))
            count += 1
    return count


def read_destination(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID) -> dict[str, Any] | None:
    """The destination's row, only if it belongs to the tenant (``DestinationConfig.from_row`` reads it)."""
    return connector.fetch_one(conn, "directory_read_destination",
                               dict(tenant_id=tenant_id, destination_id=destination_id))
