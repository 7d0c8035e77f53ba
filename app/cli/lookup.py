"""What the operator's arguments name, read before anything is written: the tenant, destination and
export an argument names, and whether the operator is granted for the tenant. Each answer that finds
nothing ends the command with its exit code."""

from __future__ import annotations

from uuid import UUID

from app.cli.common import bad_input, not_found, printable, refused
from app.store.views import Destination, Grant, Job, Schedule, Tenant, Views

#: Rows read for a name: two are enough to tell one match from an ambiguous name.
_NAME_MATCHES = 2


def _as_uuid(value: str) -> UUID | None:
    try:
        return UUID(value)
    except ValueError:
        return None


def tenant(views: Views, value: str) -> Tenant:
    """A tenant by id, or by its exact name when that names exactly one."""
    tenant_id = _as_uuid(value)
    if tenant_id is not None:
        found = views.tenant(tenant_id)
        if found is None:
            raise not_found(f"no tenant {tenant_id}")
        return found
    matches = views.tenants_named(value, limit=_NAME_MATCHES)
    if not matches:
        raise not_found(f"no tenant named {printable(value, 80)!r}")
    if len(matches) > 1:
        raise bad_input(f"several tenants are named {printable(value, 80)!r}; give the tenant's id")
    return matches[0]


def destination(views: Views, tenant_row: Tenant, value: str) -> Destination:
    """One of this tenant's destinations, by id or exact name. Another tenant's looks like a missing one."""
    destination_id = _as_uuid(value)
    if destination_id is not None:
        found = views.destination(tenant_row.id, destination_id)
        if found is None:
            raise not_found(f"no destination {destination_id} in tenant {tenant_row.name!r}")
        return found
    matches = views.destinations_named(tenant_row.id, value, limit=_NAME_MATCHES)
    if not matches:
        raise not_found(f"no destination named {printable(value, 80)!r} in tenant {tenant_row.name!r}")
    if len(matches) > 1:
        raise bad_input(f"several destinations are named {printable(value, 80)!r}; give the destination's id")
    return matches[0]


def job(views: Views, tenant_row: Tenant, job_id: UUID) -> Job:
    """This tenant's job. Another tenant's job answers with the same words as a missing one."""
    found = views.job(tenant_row.id, job_id)
    if found is None:
        raise not_found(f"no export {job_id} in tenant {tenant_row.name!r}")
    return found


def schedule(views: Views, tenant_row: Tenant, schedule_id: UUID) -> Schedule:
    """This tenant's schedule. Another tenant's answers with the same words as a missing one."""
    found = views.schedule(tenant_row.id, schedule_id)
    if found is None:
        raise not_found(f"no schedule {schedule_id} in tenant {tenant_row.name!r}")
    return found


def require_grant(views: Views, operator: str, tenant_row: Tenant, *, reconciliation: bool = False) -> Grant:
    """Refuses (exit 4) an operator who is not granted for the tenant, or lacks reconciliation access
    when it is needed. Checked before any write."""
    access = views.grant(operator, tenant_row.id)
    if access is None:
        raise refused(f"operator {printable(operator, 80)!r} is not allowed to act for tenant {tenant_row.name!r}")
    if reconciliation and not access.reconciliation:
        raise refused(f"operator {printable(operator, 80)!r} has no reconciliation access "
                      f"for tenant {tenant_row.name!r}")
    return access
