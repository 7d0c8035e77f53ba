"""Setting up before exports exist (db, operator, contacts; tenants are in ``app.cli.tenants``,
destinations in ``app.cli.destinations``): their parsers and handlers. These are for administrators; no operator
grant is checked."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import contacts as cli_contacts
from app.cli import lookup as cli_lookup
from app.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    Context,
    command,
    group,
    name,
    not_found,
    positive_int,
    refused,
    text,
)
from app.cli.output import emit
from app.store import directory, logins
from app.store.migrate import migrate


def register(commands: argparse._SubParsersAction) -> None:
    db = group(commands, "db", "the database schema")
    p = command(db, "migrate", help_="apply schema.sql (a second run changes nothing)",
                description="Apply schema.sql under an advisory lock; a second run changes nothing.")
    p.set_defaults(handler=db_migrate)
    p = command(db, "logins", help_="print (or --apply) one login per kind of process",
                description="Print the SQL that makes an application login (a member of exports_app, "
                            "exports_dispatcher and exports_notifier) and a reconciler login (a member of "
                            "exports_reconciler only), so the "
                            "application's login cannot correct outcomes even with SET ROLE. --apply runs it as this "
                            "database's owner. No password is set: give each login what pg_hba.conf asks for.")
    p.add_argument("--app-login", type=name, default=logins.APP_LOGIN, help=f"(default {logins.APP_LOGIN})")
    p.add_argument("--reconciler-login", type=name, default=logins.RECONCILER_LOGIN,
                   help=f"(default {logins.RECONCILER_LOGIN})")
    p.add_argument("--apply", action="store_true", help="run the statements instead of printing them")
    p.set_defaults(handler=db_logins)

    operator = group(commands, "operator", "operator access")
    p = command(operator, "grant", help_="let an operator act for a tenant",
                description="Let an operator act for a tenant; --reconciliation also allows corrections.",
                exits=(EXIT_NOT_FOUND, EXIT_REFUSED))
    p.add_argument("--operator", required=True, type=name)
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--reconciliation", action="store_true", help="may correct recorded outcomes")
    p.set_defaults(handler=operator_grant)

    contacts = group(commands, "contacts", "a tenant's contacts")
    p = command(contacts, "import", help_="load contacts from a CSV file (all or nothing)",
                description="Load contacts from a UTF-8 CSV file with a header: email, full_name (required), "
                            "company, phone, consent (optional); any other column is a custom field of the tenant's, "
                            "kept by its header name in the contact's attributes. Quoted values may span lines "
                            "and hold tabs; other "
                            "control characters are refused. Every row is checked before any is loaded; one "
                            "bad row loads nothing.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("file", type=text(4096))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.set_defaults(handler=contacts_import)
    p = command(contacts, "generate", help_="generate realistic fake contacts (COPY)",
                description="Generate realistic fake contacts in one COPY.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--count", required=True, type=positive_int(10_000_000))
    p.add_argument("--seed", type=int, help="for a reproducible set")
    p.set_defaults(handler=contacts_generate)


def db_migrate(ctx: Context, args: argparse.Namespace) -> int:
    applied = migrate(ctx.database().owner)
    emit(ctx, "schema applied" if applied else "schema already up to date", {"applied": applied})
    return EXIT_OK


def db_logins(ctx: Context, args: argparse.Namespace) -> int:
    names = logins.Logins(app=args.app_login, reconciler=args.reconciler_login)
    if args.apply:
        logins.apply(ctx.database().owner, names)
        emit(ctx, f"logins {names.app!r} and {names.reconciler!r} ready", {"applied": True, "app": names.app,
                                                                            "reconciler": names.reconciler})
        return EXIT_OK
    with ctx.connection() as conn:
        emit(ctx, logins.script(conn, names).rstrip("\n"), {"applied": False, "sql": logins.script(conn, names)})
    return EXIT_OK


def operator_grant(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    with ctx.connection() as conn:
        result = directory.grant_operator(conn, operator_id=args.operator, tenant_id=tenant.id,
                                          reconciliation=args.reconciliation)
    if result is directory.GrantResult.UNKNOWN_TENANT:
        raise not_found(f"no tenant {tenant.id}")
    if result is directory.GrantResult.ALREADY_GRANTED:
        existing = views.grant(args.operator, tenant.id)
        assert existing is not None   # it was there a statement ago, and no command revokes a grant
        if existing.reconciliation != args.reconciliation:
            raise refused(f"operator {args.operator!r} is already granted for tenant {tenant.name!r} with "
                          f"reconciliation={'yes' if existing.reconciliation else 'no'}; nothing changed")
    granted = "granted" if result is directory.GrantResult.GRANTED else "already granted"
    emit(ctx, f"operator {args.operator!r} {granted}"
              f" for tenant {tenant.name!r}{' with reconciliation access' if args.reconciliation else ''}",
         {"operator": args.operator, "tenant_id": str(tenant.id), "result": result.value,
          "reconciliation": args.reconciliation})
    return EXIT_OK


def contacts_import(ctx: Context, args: argparse.Namespace) -> int:
    contacts = cli_contacts.read_csv(Path(args.file))
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    with ctx.connection() as conn:
        count = directory.copy_contacts(conn, tenant_id=tenant.id, contacts=contacts)
    emit(ctx, f"{count} contacts imported into tenant {tenant.name!r}",
         {"tenant_id": str(tenant.id), "imported": count})
    return EXIT_OK


def contacts_generate(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    with ctx.connection() as conn:
        count = directory.copy_contacts(conn, tenant_id=tenant.id,
                                        contacts=cli_contacts.generate(args.count, seed=args.seed))
    emit(ctx, f"{count} contacts generated for tenant {tenant.name!r}",
         {"tenant_id": str(tenant.id), "generated": count})
    return EXIT_OK
