"""Creating an export under the file name its destination's profile renders.

The name is rendered once, here, inside the transaction that creates the export, and kept with its
delivery key (``deliveries.file_name``): every attempt, a replacement's too, delivers under it, and
cutoff 2 records it as it always did. A ``{sequence}`` is taken in the same transaction, so a create
that fails gives its number back. ``submit_create`` does it under a request id (``app.store.creation``),
so a create can be retried without making a second export.
"""

from __future__ import annotations

import uuid
from uuid import UUID

import psycopg

from app.delivery.profile import Profile
from app.store import creation, export, naming
from app.store.types import ScheduleSlot

_CREATE_REPLY = {export.CreateResult.CREATED: creation.CreateReply.CREATED,
                 export.CreateResult.KEY_TAKEN: creation.CreateReply.KEY_TAKEN,
                 export.CreateResult.UNKNOWN_DESTINATION: creation.CreateReply.UNKNOWN_DESTINATION}


def create_export(conn: psycopg.Connection, *, job_id: UUID, tenant_id: UUID, destination_id: UUID,
                  delivery_key: str, created_by: str,
                  slot: ScheduleSlot | None = None) -> tuple[export.CreateResult, str | None]:
    """Creates an original export; answers how, and the file name it will deliver under (None when not
    created). ``slot``: a schedule's (the caller's transaction writes the slot's row)."""
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
                               delivery_key=delivery_key, created_by=created_by, file_name=file_name, slot=slot)
        if result is export.CreateResult.CREATED:
            return result, file_name
        raise psycopg.Rollback()   # the key was taken: the sequence number goes back with the rest
    return result, None


def submit_create(connect: creation.Connect, *, tenant_id: UUID, destination_id: UUID, requested_by: str,
                  request_id: UUID, lock_timeout: str = creation.LOCK_TIMEOUT) -> creation.CreateAnswer:
    """``create_export`` under a request id: the same id with the same terms answers the export already
    created; a lost commit reply is settled by reading the request back."""
    terms = creation.Terms(creation.RequestKind.CREATE, requested_by, destination_id=destination_id)

    def make(conn: psycopg.Connection, job_id: UUID) -> creation.Made:
        delivery_key = uuid.uuid4().hex
        result, file_name = create_export(conn, job_id=job_id, tenant_id=tenant_id, destination_id=destination_id,
                                          delivery_key=delivery_key, created_by=requested_by)
        return creation.Made(_CREATE_REPLY[result], delivery_key, file_name)

    return creation.submit(connect, tenant_id=tenant_id, request_id=request_id, job_id=uuid.uuid4(), terms=terms,
                           make=make, lock_timeout=lock_timeout)
