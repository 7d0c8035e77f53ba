"""Setting up before exports exist (db, tenant, destination, operator, contacts): their parsers and
handlers. These are for administrators; no operator grant is checked."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from app.cli import contacts as cli_contacts
from app.cli import lookup as cli_lookup
from app.cli.common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    Context,
    Exit,
    bad_input,
    command,
    group,
    name,
    not_found,
    positive_int,
    refused,
    text,
)
from app.cli.output import emit, table
from app.delivery.credentials import parse_credential_ref
from app.delivery.errors import CredentialError, HostKeyError
from app.delivery.hostkeys import fetch_host_key, fingerprint, known_hosts_line, parse_host_key
from app.store import directory, logins, partner
from app.store.migrate import migrate

#: Seconds to wait for a server's host key with --fetch-host-key.
FETCH_HOST_KEY_TIMEOUT = 10.0
#: What ``destination add``'s own answers mean: a fetched key is only shown until --yes pins it.
DESTINATION_ADD_EXITS = (
    Exit(EXIT_NOT_FOUND, "not found: no such tenant, or the server gave no host key to fetch"),
    Exit(EXIT_REFUSED, "refused: the fetched host key is shown, not pinned, without --yes"),
)


def register(commands: argparse._SubParsersAction) -> None:
    db = group(commands, "db", "the database schema")
    p = command(db, "migrate", help_="apply schema.sql (a second run changes nothing)",
                description="Apply schema.sql under an advisory lock; a second run changes nothing.")
    p.set_defaults(handler=db_migrate)
    p = command(db, "logins", help_="print (or --apply) one login per kind of process",
                description="Print the SQL that makes an application login (a member of exports_app and "
                            "exports_dispatcher) and a reconciler login (a member of exports_reconciler only), so the "
                            "application's login cannot correct outcomes even with SET ROLE. --apply runs it as this "
                            "database's owner. No password is set: give each login what pg_hba.conf asks for.")
    p.add_argument("--app-login", type=name, default=logins.APP_LOGIN, help=f"(default {logins.APP_LOGIN})")
    p.add_argument("--reconciler-login", type=name, default=logins.RECONCILER_LOGIN,
                   help=f"(default {logins.RECONCILER_LOGIN})")
    p.add_argument("--apply", action="store_true", help="run the statements instead of printing them")
    p.set_defaults(handler=db_logins)

    tenant = group(commands, "tenant", "tenants")
    p = command(tenant, "add", help_="add a tenant and print its id", description="Add a tenant and print its id.")
    p.add_argument("name", type=name)
    p.set_defaults(handler=tenant_add)

    destination = group(commands, "destination", "partner SFTP destinations")
    p = command(destination, "add", help_="add a tenant's partner destination, its host key pinned",
                description="Add a partner SFTP destination. The host key is pinned from --host-key (one known_hosts "
                            "line), or fetched once with --fetch-host-key and pinned only with --yes. The credential "
                            "is a reference (env:VAR or keyfile:/path), never the secret.",
                exits=DESTINATION_ADD_EXITS)
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--name", required=True, type=name)
    p.add_argument("--host", required=True, type=text(255))
    p.add_argument("--port", type=_port, default=22)
    p.add_argument("--username", required=True, type=text(255))
    p.add_argument("--remote-dir", required=True, type=text(1024))
    p.add_argument("--credential-ref", required=True, type=text(1024), help="env:VAR, keyfile:/path or env-keyfile:VAR")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--host-key", type=text(16384), help='one known_hosts line: "[host]:port keytype base64"')
    key.add_argument("--fetch-host-key", action="store_true", help="fetch the server's key now (needs --yes to pin)")
    p.add_argument("--yes", action="store_true", help="confirm pinning the fetched host key")
    p.add_argument("--remote-hash", action="store_true", help="the server answers check-file-name sha256")
    p.add_argument("--acknowledgments", action="store_true", help="the partner writes <final>.ack")
    p.add_argument("--name-and-size-identify", action="store_true", help="the contract: name and size identify a file")
    p.add_argument("--read-back", action="store_true", help="the contract allows downloading a file to hash it")
    p.add_argument("--max-sessions", type=positive_int(64), default=4,
                   help="sessions the partner allows at once, over every worker host (default 4)")
    p.add_argument("--auto-retries", type=_retries, default=3,
                   help="automatic retries of a delivery proven not to have happened for a transient reason, "
                        "per delivery key; 0 turns them off (default 3)")
    p.set_defaults(handler=destination_add)
    p = command(destination, "status", help_="each destination's circuit, sessions in use, deferred jobs",
                description="Each destination's circuit (closed, or open since when and until its next probe), "
                            "the sessions open to it now over every worker host, the jobs waiting out a "
                            "deferral, and the last connection error.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", type=name, help="tenant id or exact name (default: every tenant)")
    p.set_defaults(handler=destination_status)

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


def _port(value: str) -> int:
    return positive_int(65535)(value)


_port.__name__ = "port"


def _retries(value: str) -> int:
    return 0 if value.strip() == "0" else positive_int(20)(value)


_retries.__name__ = "retries"


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


def tenant_add(ctx: Context, args: argparse.Namespace) -> int:
    tenant_id = uuid.uuid4()
    with ctx.connection() as conn:
        directory.add_tenant(conn, tenant_id=tenant_id, name=args.name)
    emit(ctx, f"tenant {args.name!r} added: {tenant_id}", {"tenant_id": str(tenant_id), "name": args.name})
    return EXIT_OK


def destination_add(ctx: Context, args: argparse.Namespace) -> int:
    try:
        credential_ref = str(parse_credential_ref(args.credential_ref))
    except CredentialError as exc:
        raise bad_input(f"--credential-ref: {exc}") from None
    if args.fetch_host_key:
        try:
            key = fetch_host_key(args.host, args.port, FETCH_HOST_KEY_TIMEOUT)
        except HostKeyError as exc:
            raise not_found(str(exc)) from None
        line = known_hosts_line(args.host, args.port, key)
        if not args.yes:
            raise refused(f"{args.host}:{args.port} presents {key.get_name()} {fingerprint(key)}; "
                          "check it with the partner and re-run with --yes to pin it",
                          host_key=line, fingerprint=fingerprint(key))
    else:
        try:
            line, key = parse_host_key(args.host_key, args.host, args.port)
        except HostKeyError as exc:
            raise bad_input(f"--host-key: {exc}") from None
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    destination_id = uuid.uuid4()
    new = directory.NewDestination(
        tenant_id=tenant.id, name=args.name, host=args.host, port=args.port, username=args.username,
        remote_dir=args.remote_dir, host_key=line, credential_ref=credential_ref, remote_hash=args.remote_hash,
        acknowledgments=args.acknowledgments, name_and_size_identify=args.name_and_size_identify,
        read_back=args.read_back, max_sessions=args.max_sessions, auto_retries=args.auto_retries)
    with ctx.connection() as conn:
        added = directory.add_destination(conn, destination_id=destination_id, destination=new)
        if added is directory.AddResult.UNKNOWN_TENANT:
            raise not_found(f"no tenant {tenant.id}")
    emit(ctx, f"destination {args.name!r} added to tenant {tenant.name!r}: {destination_id}\n"
              f"  pinned host key {key.get_name()} {fingerprint(key)}",
         {"destination_id": str(destination_id), "tenant_id": str(tenant.id), "host_key": line,
          "fingerprint": fingerprint(key)})
    return EXIT_OK


STATUS_HEADERS = ["tenant", "destination", "host", "circuit", "next probe", "failures", "sessions", "deferred",
                  "retries", "last error"]


def destination_status(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant) if args.tenant else None
    with ctx.connection() as conn:
        found = partner.statuses(conn, tenant_id=tenant.id if tenant else None)
    rows = [[d.tenant_name, d.name, f"{d.host}:{d.port}", d.state + ("" if d.active else " (inactive)"),
             d.next_probe_at, d.failures or 0, f"{d.sessions_in_use}/{d.max_sessions}", d.deferred_jobs,
             d.auto_retries or "off", d.last_error] for d in found]
    data = [{"destination_id": d.id, "tenant": d.tenant_name, "name": d.name, "host": d.host, "port": d.port,
             "active": d.active, "circuit": d.state, "opened_at": d.opened_at, "next_probe_at": d.next_probe_at,
             "failures": d.failures or 0, "sessions_in_use": d.sessions_in_use, "max_sessions": d.max_sessions,
             "deferred_jobs": d.deferred_jobs, "auto_retries": d.auto_retries, "last_error": d.last_error}
            for d in found]
    emit(ctx, table(STATUS_HEADERS, rows) if found else "no destinations", data)
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
