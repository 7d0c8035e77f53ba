"""Setting up before exports exist: the schema, tenants, destinations, operator grants, contacts."""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli import contacts as cli_contacts, lookup as cli_lookup
from app.cli.common import EXIT_OK, Context, bad_input, not_found, printable, refused
from app.cli.output import emit
from app.store import directory, models
from app.store.migrate import migrate

if TYPE_CHECKING:
    import paramiko

#: Seconds to wait for a server's host key with --fetch-host-key.
FETCH_HOST_KEY_TIMEOUT = 10.0
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def db_migrate(ctx: Context, args: argparse.Namespace) -> int:
    applied = migrate(ctx.database_url())
    emit(ctx, "schema applied" if applied else "schema already up to date", {"applied": applied})
    return EXIT_OK


def tenant_add(ctx: Context, args: argparse.Namespace) -> int:
    tenant_id = uuid.uuid4()
    with ctx.connection() as conn:
        directory.add_tenant(conn, tenant_id=tenant_id, name=args.name)
    emit(ctx, f"tenant {args.name!r} added: {tenant_id}", {"tenant_id": str(tenant_id), "name": args.name})
    return EXIT_OK


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: "paramiko.PKey") -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse_host_key(line: str, host: str, port: int) -> tuple[str, "paramiko.PKey"]:
    """Validates one known_hosts line for this host and port; returns it normalized with its key."""
    from paramiko.hostkeys import HostKeyEntry

    try:
        entry = HostKeyEntry.from_line(line)
    except Exception:
        entry = None
    if entry is None or entry.key is None:
        raise bad_input("--host-key is not a known_hosts line (\"[host]:port keytype base64\")")
    expected = known_hosts_name(host, port)
    if expected not in entry.hostnames:
        raise bad_input(f"--host-key names {printable(','.join(entry.hostnames), 80)}, not {expected}")
    return f"{expected} {entry.key.get_name()} {entry.key.get_base64()}", entry.key


def fetch_host_key(host: str, port: int) -> "paramiko.PKey":
    """The key the server presents now. Trust on first use, which is why it needs --yes."""
    import paramiko

    try:
        transport = paramiko.Transport((host, port))
    except OSError as exc:
        raise not_found(f"cannot reach {host}:{port}: {exc.strerror or exc}") from None
    try:
        transport.banner_timeout = FETCH_HOST_KEY_TIMEOUT
        transport.start_client(timeout=FETCH_HOST_KEY_TIMEOUT)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise not_found(f"{host}:{port} did not present an SSH host key: {type(exc).__name__}") from None
    finally:
        transport.close()


def check_credential_ref(ref: str) -> str:
    kind, sep, target = ref.partition(":")
    if sep and kind in ("env", "env-keyfile") and _ENV_NAME.match(target):
        return ref
    if sep and kind == "keyfile" and target.startswith("/"):
        return ref
    raise bad_input("--credential-ref must be env:VARIABLE, keyfile:/absolute/path or env-keyfile:VARIABLE "
                    "(a reference to the secret, never the secret)")


def destination_add(ctx: Context, args: argparse.Namespace) -> int:
    credential_ref = check_credential_ref(args.credential_ref)
    if args.fetch_host_key:
        key = fetch_host_key(args.host, args.port)
        line = f"{known_hosts_name(args.host, args.port)} {key.get_name()} {key.get_base64()}"
        if not args.yes:
            raise refused(f"{args.host}:{args.port} presents {key.get_name()} {fingerprint(key)}; "
                          "check it with the partner and re-run with --yes to pin it",
                          host_key=line, fingerprint=fingerprint(key))
    else:
        line, key = parse_host_key(args.host_key, args.host, args.port)
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant)
    destination_id = uuid.uuid4()
    new = directory.NewDestination(
        tenant_id=tenant.id, name=args.name, host=args.host, port=args.port, username=args.username,
        remote_dir=args.remote_dir, host_key=line, credential_ref=credential_ref, remote_hash=args.remote_hash,
        acknowledgments=args.acknowledgments, name_and_size_identify=args.name_and_size_identify,
        read_back=args.read_back)
    with ctx.connection() as conn:
        if directory.add_destination(conn, destination_id=destination_id, destination=new) is directory.AddResult.UNKNOWN_TENANT:
            raise not_found(f"no tenant {tenant.id}")
    emit(ctx, f"destination {args.name!r} added to tenant {tenant.name!r}: {destination_id}\n"
              f"  pinned host key {key.get_name()} {fingerprint(key)}",
         {"destination_id": str(destination_id), "tenant_id": str(tenant.id), "host_key": line,
          "fingerprint": fingerprint(key)})
    return EXIT_OK


def operator_grant(ctx: Context, args: argparse.Namespace) -> int:
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant)
    with ctx.connection() as conn:
        result = directory.grant_operator(conn, operator_id=args.operator, tenant_id=tenant.id,
                                          reconciliation=args.reconciliation)
    if result is directory.GrantResult.UNKNOWN_TENANT:
        raise not_found(f"no tenant {tenant.id}")
    if result is directory.GrantResult.ALREADY_GRANTED:
        existing = models.OperatorAccess.get(
            (models.OperatorAccess.operator_id == args.operator) & (models.OperatorAccess.tenant_id == tenant.id))
        if existing.reconciliation != args.reconciliation:
            raise refused(f"operator {args.operator!r} is already granted for tenant {tenant.name!r} with "
                          f"reconciliation={'yes' if existing.reconciliation else 'no'}; nothing changed")
    emit(ctx, f"operator {args.operator!r} {'granted' if result is directory.GrantResult.GRANTED else 'already granted'}"
              f" for tenant {tenant.name!r}{' with reconciliation access' if args.reconciliation else ''}",
         {"operator": args.operator, "tenant_id": str(tenant.id), "result": result.value,
          "reconciliation": args.reconciliation})
    return EXIT_OK


def contacts_import(ctx: Context, args: argparse.Namespace) -> int:
    contacts = cli_contacts.read_csv(Path(args.file))
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant)
    with ctx.connection() as conn:
        count = directory.copy_contacts(conn, tenant_id=tenant.id, contacts=contacts)
    emit(ctx, f"{count} contacts imported into tenant {tenant.name!r}", {"tenant_id": str(tenant.id), "imported": count})
    return EXIT_OK


def contacts_generate(ctx: Context, args: argparse.Namespace) -> int:
    ctx.models()
    tenant = cli_lookup.tenant(args.tenant)
    with ctx.connection() as conn:
        count = directory.copy_contacts(conn, tenant_id=tenant.id, contacts=cli_contacts.generate(args.count, seed=args.seed))
    emit(ctx, f"{count} contacts generated for tenant {tenant.name!r}", {"tenant_id": str(tenant.id), "generated": count})
    return EXIT_OK
