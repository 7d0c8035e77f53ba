"""Tenants, destinations, operator access and contacts: the rows an export needs before it exists.

One function per named statement in ``sql/directory.sql``, the connection first, a typed answer.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

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
    #: The delivery profile's first version, whole (``app.delivery.profile.Profile.to_json``).
    profile: Mapping[str, Any]
    #: Who added it: the profile's first version records it.
    created_by: str
    remote_hash: bool = False
    acknowledgments: bool = False
    name_and_size_identify: bool = False
    read_back: bool = False
    #: Sessions the partner allows at once, over every worker host.
    max_sessions: int = 4
    #: Automatic retries of a proven non-delivery per delivery key; 0: off.
    auto_retries: int = 3
    #: How a delivery publishes a file on the partner's server (``app.delivery.modes.DeliveryMode``'s value).
    delivery_mode: str = "standard"
    #: The partner's limit on our uploads, in bytes per second; None: none.
    bandwidth_limit: int | None = None


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
    params = {**destination.__dict__, "destination_id": destination_id, "profile": Jsonb(dict(destination.profile))}
    try:
        with conn.transaction():   # the deferred check that the profile exists runs at this commit
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


@dataclass(frozen=True)
class Revoked:
    """The grant a revoke ended."""

    granted_at: datetime
    reconciliation: bool
    revoked_at: datetime


def revoke_operator(conn: psycopg.Connection, *, operator_id: str, tenant_id: UUID, revoked_by: str) -> Revoked | None:
    """Ends the operator's live grant for the tenant; None when there was none (nothing changed)."""
    rows = connector.fetch_all(conn, "directory_revoke_operator", dict(
        operator_id=operator_id, tenant_id=tenant_id, revoked_by=revoked_by))
    if len(rows) > 1:   # uq_operator_access_live allows one live grant per pair
        raise StoreError(f"directory_revoke_operator ended {len(rows)} grants")
    return Revoked(rows[0]["granted_at"], rows[0]["reconciliation"], rows[0]["revoked_at"]) if rows else None


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


class ProfileEdit(enum.Enum):
    EDITED = "Edited"
    #: Another edit committed first (or the destination is not the tenant's): nothing written.
    STALE = "Stale"


@dataclass(frozen=True)
class StoredProfile:
    version: int
    profile: dict[str, Any]
    created_by: str
    created_at: datetime
    current_version: int


def read_profile(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID,
                 version: int | None = None) -> StoredProfile | None:
    """The destination's profile at ``version`` (default: the current one), if the destination is the tenant's."""
    row = connector.fetch_one(conn, "directory_read_profile",
                              dict(tenant_id=tenant_id, destination_id=destination_id, version=version))
    return None if row is None else StoredProfile(**row)


def edit_profile(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, expected_version: int,
                 profile: Mapping[str, Any], created_by: str) -> tuple[ProfileEdit, int | None]:
    """Writes the profile as the next version, only over ``expected_version``; answers the new version."""
    with conn.transaction():
        row = connector.fetch_one(conn, "directory_edit_profile", dict(
            tenant_id=tenant_id, destination_id=destination_id, expected_version=expected_version,
            profile=Jsonb(dict(profile)), created_by=created_by))
    return (ProfileEdit.STALE, None) if row is None else (ProfileEdit.EDITED, row["version"])


def add_host_key(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, line: str) -> int | None:
    """Pins one more key; answers how many are pinned now, None when it was pinned already (or no such
    destination: the caller looked it up first)."""
    row = connector.fetch_one(conn, "directory_add_host_key",
                              dict(tenant_id=tenant_id, destination_id=destination_id, line=line))
    return None if row is None else int(row["pinned"])


def remove_host_key(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, line: str) -> int | None:
    """Unpins one key while another stays; answers how many are pinned now, None when nothing changed."""
    row = connector.fetch_one(conn, "directory_remove_host_key",
                              dict(tenant_id=tenant_id, destination_id=destination_id, line=line))
    return None if row is None else int(row["pinned"])


def set_delivery(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID, delivery_mode: str | None,
                 set_limit: bool, bandwidth_limit: int | None,
                 max_sessions: int | None = None) -> dict[str, Any] | None:
    """Sets the delivery mode and the sessions at once (each unless None) and, with ``set_limit``, the
    bandwidth limit (None: none); answers the three as written, or None when nothing matched: no such
    destination of the tenant, or mode no-rename for a profile without a completion marker."""
    return connector.fetch_one(conn, "directory_set_delivery", dict(
        tenant_id=tenant_id, destination_id=destination_id, delivery_mode=delivery_mode, set_limit=set_limit,
        bandwidth_limit=bandwidth_limit, max_sessions=max_sessions))


def read_destination(conn: psycopg.Connection, *, tenant_id: UUID, destination_id: UUID) -> dict[str, Any] | None:
    """The destination's row, only if it belongs to the tenant (``DestinationConfig.from_row`` reads it)."""
    return connector.fetch_one(conn, "directory_read_destination",
                               dict(tenant_id=tenant_id, destination_id=destination_id))
