"""Setting up before exports exist (db, operator, contacts; tenants are in ``app.cli.tenants``,
destinations in ``app.cli.destinations``): their parsers and handlers. These are for administrators; no operator
grant is checked."""

from __future__ import annotations

import argparse
import dataclasses
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
    operator_name,
    positive_int,
    refused,
    text,
)
from app.cli.output import emit, table
from app.store import directory, erasure, logins
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
    p = command(operator, "revoke", help_="end an operator's grant for a tenant (kept as history)",
                description="End an operator's grant for a tenant: from then on its create, cancel, replace and "
                            "every other write for the tenant is refused (4) exactly as if it had never been "
                            "granted. The grant stays on record with who revoked it and when (operator list "
                            "--revoked); granting again starts a new period. Revoking an operator that holds no "
                            "grant changes nothing and says so.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("operator", type=name, metavar="OPERATOR")
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--by", type=name, help="who revokes it (default: this login's name)")
    p.set_defaults(handler=operator_revoke)
    p = command(operator, "list", help_="the operators granted for a tenant",
                description="List the operators granted for a tenant, with reconciliation access and since when; "
                            "--revoked adds the grants that were revoked, with who revoked them and when.",
                exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--revoked", action="store_true", help="include revoked grants")
    p.set_defaults(handler=operator_list)

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
    p = command(contacts, "erase", help_="erase a person's contacts from a tenant (GDPR), and say where they went",
                description="Delete the tenant's contacts with this email address (compared case-insensitively) so "
                            "no later export carries them, and record the erasure (who, when, how many; never the "
                            "address). Files record no rows, so it says where the address may already be: per "
                            "destination, the exports delivered, undetermined, or in flight now (a build under way "
                            "read its contacts when it started), unless the contacts never consented (never in a "
                            "file). Ask those partners to delete it. --dry-run says the same and erases nothing. "
                            "An address with no contact changes nothing and says so.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--email", required=True, type=text(320), help="the address to erase")
    p.add_argument("--by", type=name, help="who erases it, for the record (default: this login's name)")
    p.add_argument("--reason", type=text(), help="the request's reference (a ticket), for the record")
    p.add_argument("--dry-run", action="store_true", help="say what would be erased and where it went; erase nothing")
    p.set_defaults(handler=contacts_erase)
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
        if existing is None:
            raise refused(f"operator {args.operator!r}'s grant for tenant {tenant.name!r} was revoked while this "
                          "grant was recorded; nothing changed: run it again")
        if existing.reconciliation != args.reconciliation:
            raise refused(f"operator {args.operator!r} is already granted for tenant {tenant.name!r} with "
                          f"reconciliation={'yes' if existing.reconciliation else 'no'}; nothing changed")
    granted = "granted" if result is directory.GrantResult.GRANTED else "already granted"
    emit(ctx, f"operator {args.operator!r} {granted}"
              f" for tenant {tenant.name!r}{' with reconciliation access' if args.reconciliation else ''}",
         {"operator": args.operator, "tenant_id": str(tenant.id), "result": result.value,
          "reconciliation": args.reconciliation})
    return EXIT_OK


def operator_revoke(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    by = operator_name(args.by)
    with ctx.connection() as conn:
        revoked = directory.revoke_operator(conn, operator_id=args.operator, tenant_id=tenant.id, revoked_by=by)
    data = {"operator": args.operator, "tenant_id": str(tenant.id), "result": "Revoked" if revoked else "NotGranted",
            "revoked_by": by, **(dataclasses.asdict(revoked) if revoked else {})}
    if revoked is None:
        emit(ctx, f"operator {args.operator!r} holds no grant for tenant {tenant.name!r}; nothing changed", data)
    else:
        emit(ctx, f"operator {args.operator!r} may no longer act for tenant {tenant.name!r} (granted "
                  f"{revoked.granted_at:%Y-%m-%d %H:%M:%S}, revoked by {by!r}; kept as history)", data)
    return EXIT_OK


def operator_list(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    grants = views.grants(tenant.id, revoked=args.revoked)
    rows = [[g.operator_id, "yes" if g.reconciliation else "no", g.granted_at, g.revoked_at, g.revoked_by]
            for g in grants]
    headers = ["operator", "reconciliation", "granted", "revoked", "revoked by"]
    emit(ctx, table(headers if args.revoked else headers[:3], [r if args.revoked else r[:3] for r in rows])
         if rows else f"no operator is granted for tenant {tenant.name!r}",
         {"tenant_id": str(tenant.id), "grants": [
             {"operator": g.operator_id, "reconciliation": g.reconciliation, "granted_at": g.granted_at,
              "revoked_at": g.revoked_at, "revoked_by": g.revoked_by, "live": g.revoked_at is None}
             for g in grants]})
    return EXIT_OK


def contacts_import(ctx: Context, args: argparse.Namespace) -> int:
    contacts = cli_contacts.read_csv(Path(args.file))
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    with ctx.connection() as conn:
        count = directory.copy_contacts(conn, tenant_id=tenant.id, contacts=contacts)
    emit(ctx, f"{count} contacts imported into tenant {tenant.name!r}",
         {"tenant_id": str(tenant.id), "imported": count})
    return EXIT_OK


def contacts_erase(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    by = operator_name(args.by)
    with ctx.connection() as conn, conn.transaction():
        found = erasure.find(conn, tenant_id=tenant.id, email=args.email)
        exposure = erasure.exposure(conn, tenant_id=tenant.id) if found.ever_consented else []
        erased = None if args.dry_run or not found.contacts else erasure.erase(
            conn, tenant_id=tenant.id, email=args.email, erased_by=by, reason=args.reason)
    if erased is not None:
        result, head = "Erased", (f"{erased.contacts_erased} contact(s) erased from tenant {tenant.name!r} "
                                  f"(erasure {erased.erasure_id}, by {by!r})")
    elif args.dry_run and found.contacts:
        result, head = "DryRun", (f"{found.contacts} contact(s) of tenant {tenant.name!r} would be erased "
                                  "(dry run: nothing changed)")
    else:   # none there, or erased by another erasure that committed between the look and the delete
        result, head = "NothingToErase", (f"no contact of tenant {tenant.name!r} has that address (erased already, "
                                          "or never there); nothing changed")
    emit(ctx, head + _where_it_went(found, exposure),
         {"tenant_id": str(tenant.id), "result": result, "dry_run": args.dry_run,
          "contacts": erased.contacts_erased if erased else found.contacts,
          "erasure_id": erased.erasure_id if erased else None, "ever_consented": found.ever_consented,
          "rows_known": False, "may_be_at": [dataclasses.asdict(e) for e in exposure]})
    return EXIT_OK


def _where_it_went(found: erasure.Found, exposure: list[erasure.Exposure]) -> str:
    """Where an erased address may already be: files record no rows, so the destinations, not the files."""
    if not found.contacts:
        return ""
    if not found.ever_consented:
        return "\nnever consented, so never in an exported file: no partner holds it"
    if not exposure:
        return "\nno export of the tenant delivered a file or is under way: no partner holds it"
    return ("\nwhich files held it cannot be known (files record no rows); it may be in the files sent to these "
            "destinations: ask each partner to delete it\n"
            + table(["destination", "host", "delivered", "first", "last", "undetermined", "in flight"],
                    [[e.destination, e.host, e.delivered, e.first_delivered, e.last_delivered, e.undetermined,
                      e.in_flight] for e in exposure]))


def contacts_generate(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    with ctx.connection() as conn:
        count = directory.copy_contacts(conn, tenant_id=tenant.id,
                                        contacts=cli_contacts.generate(args.count, seed=args.seed))
    emit(ctx, f"{count} contacts generated for tenant {tenant.name!r}",
         {"tenant_id": str(tenant.id), "generated": count})
    return EXIT_OK
