"""``exports tenant add|list|pause|resume``: the tenants, and holding all of one tenant's exports.

A paused tenant's queued exports wait unclaimed, as a paused destination's do, and ``create`` still queues
one; the resume wakes them (all but those a paused or draining destination still holds). For
administrators, like ``tenant add``; ``--by`` is recorded.
"""

from __future__ import annotations

import argparse
import uuid

from app.cli import lookup as cli_lookup
from app.cli.common import EXIT_NOT_FOUND, EXIT_OK, Context, command, group, name, operator_name, text
from app.cli.output import emit, table
from app.store import directory, pausing

LIST_HEADERS = ["tenant", "id", "paused", "destinations", "paused destinations", "queued", "running"]


def register(commands: argparse._SubParsersAction) -> None:
    tenant = group(commands, "tenant", "tenants")
    p = command(tenant, "add", help_="add a tenant and print its id", description="Add a tenant and print its id.")
    p.add_argument("name", type=name)
    p.set_defaults(handler=tenant_add)

    p = command(tenant, "list", help_="every tenant, whether it is paused, its destinations and queue",
                description="Every tenant: its id, whether it is paused (by whom, why), how many destinations it "
                            "has and how many of those are paused or draining, and its exports queued and running.")
    p.set_defaults(handler=tenant_list)

    p = command(tenant, "pause", help_="hold every queued export of a tenant until it is resumed",
                description="Pause the tenant: from now none of its exports starts an attempt; its queued exports "
                            "wait, unclaimed, neither canceled nor failed, until `exports tenant resume`. Creating "
                            "an export for a paused tenant still queues it (it waits too). Attempts already "
                            "running are not stopped.", exits=(EXIT_NOT_FOUND,))
    _naming(p)
    p.set_defaults(handler=tenant_pause)

    p = command(tenant, "resume", help_="release a paused tenant's queued exports",
                description="Resume the tenant: its queued exports get a fresh wake-up in the same statement, but "
                            "those of a paused or draining destination, which keep waiting for `exports "
                            "destination resume`.", exits=(EXIT_NOT_FOUND,))
    _naming(p)
    p.set_defaults(handler=tenant_resume)


def tenant_add(ctx: Context, args: argparse.Namespace) -> int:
    tenant_id = uuid.uuid4()
    with ctx.connection() as conn:
        directory.add_tenant(conn, tenant_id=tenant_id, name=args.name)
    emit(ctx, f"tenant {args.name!r} added: {tenant_id}", {"tenant_id": str(tenant_id), "name": args.name})
    return EXIT_OK


def _naming(p: argparse.ArgumentParser) -> None:
    p.add_argument("tenant", type=name, metavar="TENANT", help="tenant id or exact name")
    p.add_argument("--by", type=name, help="who does it, for the record (default: this login's name)")
    p.add_argument("--reason", type=text(), help="why, for the record and `tenant list`")


def _paused(row: pausing.TenantRow) -> str | None:
    if row.paused_at is None:
        return None
    return f"by {row.paused_by} since {row.paused_at:%Y-%m-%d %H:%M:%S}" + (
        f": {row.paused_reason}" if row.paused_reason else "")


def tenant_list(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.connection() as conn:
        rows = pausing.list_tenants(conn)
    human = table(LIST_HEADERS, [[r.name, r.id, _paused(r) or "no", r.destinations, r.paused_destinations, r.queued,
                                  r.running] for r in rows]) if rows else "no tenants"
    emit(ctx, human, [{"tenant_id": str(r.id), "name": r.name, "created_at": r.created_at,
                       "paused": r.paused_at is not None, "paused_by": r.paused_by, "paused_reason": r.paused_reason,
                       "paused_at": r.paused_at, "destinations": r.destinations,
                       "paused_destinations": r.paused_destinations, "queued": r.queued, "running": r.running}
                      for r in rows])
    return EXIT_OK


def tenant_pause(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    with ctx.connection() as conn:
        changed = pausing.pause_tenant(conn, tenant_id=tenant.id, changed_by=operator_name(args.by),
                                       reason=args.reason)
        [row] = pausing.list_tenants(conn, tenant_id=tenant.id)
    data = {"tenant_id": str(tenant.id), "name": tenant.name, "changed": changed, "paused_by": row.paused_by,
            "paused_reason": row.paused_reason, "paused_at": row.paused_at, "queued": row.queued,
            "running": row.running}
    if not changed:
        emit(ctx, f"tenant {tenant.name!r} is paused already ({_paused(row)}); nothing changed", data)
        return EXIT_OK
    running = f"; {row.running} attempts already running finish" if row.running else ""
    emit(ctx, f"tenant {tenant.name!r} paused: {row.queued} queued exports wait until `exports tenant resume`; "
              f"exports created meanwhile queue and wait too{running}", data)
    return EXIT_OK


def tenant_resume(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    with ctx.connection() as conn:
        resumed = pausing.resume_tenant(conn, tenant_id=tenant.id, changed_by=operator_name(args.by),
                                        reason=args.reason)
    data = {"tenant_id": str(tenant.id), "name": tenant.name, "changed": resumed.resumed, "woken": resumed.woken}
    if not resumed.resumed:
        emit(ctx, f"tenant {tenant.name!r} is not paused; nothing changed", data)
        return EXIT_OK
    emit(ctx, f"tenant {tenant.name!r} resumed: {resumed.woken} queued exports woken (a paused or draining "
              "destination's keep waiting)", data)
    return EXIT_OK
