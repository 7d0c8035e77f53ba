"""Creating an export under the file name its destination's profile renders.

The name is rendered once, here, inside the transaction that creates the export, and kept with its
delivery key (``deliveries.file_name``): every attempt, a replacement's too, delivers under it, and
cutoff 2 records it as it always did. A ``{sequence}`` is taken in the same transaction, so a create
that fails gives its number back.
"""

from __future__ import annotations

from uuid import UUID

import psycopg

from app.delivery.profile import Profile
from app.store import export, naming


def create_export(conn: psycopg.Connection, *, job_id: UUID, tenant_id: UUID, destination_id: UUID,
                  delivery_key: str, created_by: str) -> tuple[export.CreateResult, str | None]:
    """Creates an original export; answers how, and the file name it will deliver under (None when not
    created)."""
    result = export.CreateResult.UNKNOWN_DESTINATION
    with conn.transaction():
        found = naming.read(conn, tenant_id=tenant_id, destination_id=destination_id)
        if found is None:
            return result, None
        profile = Profile.from_json(found.profile)
        sequence = naming.take_sequence(conn, tenant_id=tenant_id, destination_id=destination_id) \
            if profile.uses_sequence else None
        file_name = profile.render_file_name(delivery_key=delivery_key, tenant_name=found.tenant_name,
                                             created_at=found.created_at, sequence=sequence)
        result = export.create(conn, job_id=job_id, tenant_id=tenant_id, destination_id=destination_id,
                               delivery_key=delivery_key, created_by=created_by, file_name=file_name)
        if result is export.CreateResult.CREATED:
            return result, file_name
        raise psycopg.Rollback()   # the key was taken: the sequence number goes back with the rest
    return result, None
