"""Reads the operator scripts make before they write: which tenant, destination and job an argument
names, and whether the operator is granted for the tenant. Reads go through the peewee models."""

from __future__ import annotations

from uuid import UUID

from app.cli.common import bad_input, not_found, printable, refused
from app.store import models


def _as_uuid(value: str) -> UUID | None:
    try:
        return UUID(value)
    except ValueError:
        return None


def tenant(value: str) -> models.Tenant:
    """A tenant by id, or by its exact name when that names exactly one."""
    tenant_id = _as_uuid(value)
    if tenant_id is not None:
        found = models.Tenant.get_or_none(models.Tenant.id == tenant_id)
        if found is None:
            raise not_found(f"no tenant {tenant_id}")
        return found
    matches = list(models.Tenant.select().where(models.Tenant.name == value).limit(2))
    if not matches:
        raise not_found(f"no tenant named {printable(value, 80)!r}")
    if len(matches) > 1:
        raise bad_input(f"several tenants are named {printable(value, 80)!r}; give the tenant's id")
    return matches[0]


def destination(tenant_row: models.Tenant, value: str) -> models.Destination:
    """One of this tenant's destinations, by id or exact name. Another tenant's looks like a missing one."""
    query = models.Destination.select().where(models.Destination.tenant_id == tenant_row.id)
    destination_id = _as_uuid(value)
    if destination_id is not None:
        found = query.where(models.Destination.id == destination_id).first()
        if found is None:
            raise not_found(f"no destination {destination_id} in tenant {tenant_row.name!r}")
        return found
    matches = list(query.where(models.Destination.name == value).limit(2))
    if not matches:
        raise not_found(f"no destination named {printable(value, 80)!r} in tenant {tenant_row.name!r}")
    if len(matches) > 1:
        raise bad_input(f"several destinations are named {printable(value, 80)!r}; give the destination's id")
    return matches[0]


def job(tenant_row: models.Tenant, job_id: UUID) -> models.ExportJob:
    """This tenant's job. Another tenant's job answers with the same words as a missing one."""
    found = models.ExportJob.get_or_none((models.ExportJob.id == job_id) & (models.ExportJob.tenant_id == tenant_row.id))
    if found is None:
        raise not_found(f"no export {job_id} in tenant {tenant_row.name!r}")
    return found


def require_grant(operator: str, tenant_row: models.Tenant, *, reconciliation: bool = False) -> models.OperatorAccess:
    """Refuses (exit 4) an operator who is not granted for the tenant, or lacks reconciliation access
    when it is needed. Checked before any write."""
    access = models.OperatorAccess.get_or_none(
        (models.OperatorAccess.operator_id == operator) & (models.OperatorAccess.tenant_id == tenant_row.id))
    if access is None:
        raise refused(f"operator {printable(operator, 80)!r} is not allowed to act for tenant {tenant_row.name!r}")
    if reconciliation and not access.reconciliation:
        raise refused(f"operator {printable(operator, 80)!r} has no reconciliation access for tenant {tenant_row.name!r}")
    return access
