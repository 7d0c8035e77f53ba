"""Partner destinations (add, edit, show, check, check-credential, status, host-key add|remove; what pause,
drain and resume do is in ``destination_pauses``, the credential check in ``credential_check``): their
parsers and handlers.

A destination is an SFTP endpoint with its pinned host keys, and a delivery profile that says what the
partner receives. ``destination add`` sets both; ``destination edit`` writes a new profile version
over the one it read; ``host-key add`` pins the key a partner rotates to beside the old one, and
``host-key remove`` unpins one by its fingerprint, never the last. These are for administrators; no
operator grant is checked.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import paramiko

from app.cli import credential_check, delivery_options, destination_pauses, profile_options
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
    operator_name,
    positive_int,
    refused,
    text,
)
from app.cli.output import emit, table
from app.delivery.classifier import describe
from app.delivery.config import DestinationConfig
from app.delivery.credentials import parse_credential_ref
from app.delivery.destination import Destination as SftpDestination
from app.delivery.errors import CredentialError, DestinationError, HostKeyError
from app.delivery.hostkeys import fetch_host_key, fingerprint, known_hosts_line, parse_host_key
from app.delivery.profile import Profile
from app.store import directory, edits, partner, pausing
from app.store.views import Destination, Tenant

#: Seconds to wait for a server's host key with --fetch-host-key.
FETCH_HOST_KEY_TIMEOUT = 10.0
#: What ``destination add``'s own answers mean: a fetched key is only shown until --yes pins it.
DESTINATION_ADD_EXITS = (
    Exit(EXIT_NOT_FOUND, "not found: no such tenant, or the server gave no host key to fetch"),
    Exit(EXIT_REFUSED, "refused: the fetched host key is shown, not pinned, without --yes"),
    *credential_check.CHECK_EXITS,
)
DESTINATION_EDIT_EXITS = (
    EXIT_NOT_FOUND,
    Exit(EXIT_REFUSED, "refused: the profile is not the version given, or another edit committed first; "
                       "nothing written"),
    *credential_check.CHECK_EXITS,
)
#: The partner's contract flags ``destination edit`` changes, with what each says (``destination add`` sets them).
CONTRACT_HELP = {
    "remote_hash": "the server answers check-file-name sha256",
    "acknowledgments": "the partner writes <final>.ack",
    "name_and_size_identify": "the contract: name and size identify a file",
    "read_back": "the contract allows downloading a file to hash it",
}
CONTRACT_FLAGS = edits.CONTRACT_FLAGS
#: Rows ``exports preview`` prints unless told otherwise, and at most.
PREVIEW_ROWS = 10
MAX_PREVIEW_ROWS = 10_000


def register(commands: argparse._SubParsersAction) -> None:
    destination = group(commands, "destination", "partner SFTP destinations and what they receive")
    p = command(destination, "add", help_="add a tenant's partner destination, its host key pinned",
                description="Add a partner SFTP destination. The host key is pinned from --host-key (one known_hosts "
                            "line), or fetched once with --fetch-host-key and pinned only with --yes. The credential "
                            "is a reference (env:VAR or keyfile:/path), never the secret; it is resolved here and "
                            "used to log in with the pinned key before anything is recorded (--no-check skips that, "
                            "for a server not reachable yet). The delivery profile "
                            "options say what the partner receives; without them, the four contact columns as CSV "
                            "named contacts-<delivery key>.csv.",
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
    p.add_argument("--by", type=name, help="who adds it, for the profile's record (default: this login's name)")
    credential_check.add_option(p)
    profile_options.add(p, editing=False)
    delivery_options.add(p, editing=False)
    p.set_defaults(handler=destination_add)

    p = command(destination, "edit", help_="change what a destination's partner receives (a new profile version)",
                description="Write a new version of the destination's delivery profile: the options given change, "
                            "the others keep their value. Exports created from now on are named by it; an export "
                            "builds with the version current when its attempt starts, never a mix, and cutoff 2 "
                            "records which. --credential changes the credential reference (checked by logging in "
                            "first, unless --no-check) and the contract flags what the partner's contract allows; "
                            "each is recorded with who and why, and applies to the attempts that start after it. "
                            "Host keys are pinned and unpinned with `destination host-key add|remove`. Nothing is "
                            "written when nothing changes.",
                exits=DESTINATION_EDIT_EXITS)
    _naming_one(p)
    p.add_argument("--by", type=name, help="who edits it, for the profile's record (default: this login's name)")
    p.add_argument("--reason", type=text(), help="why, recorded with a credential or contract change")
    p.add_argument("--credential", "--credential-ref", dest="credential_ref", type=text(1024), metavar="REF",
                   help="a new credential reference: env:VAR, keyfile:/path or env-keyfile:VAR")
    credential_check.add_option(p)
    for flag, meaning in CONTRACT_HELP.items():
        p.add_argument(f"--{flag.replace('_', '-')}", dest=flag, action=argparse.BooleanOptionalAction,
                       default=None, help=meaning)
    p.add_argument("--expected-version", type=positive_int(1_000_000), metavar="N",
                   help="edit only if the profile is still version N (what destination show printed)")
    profile_options.add(p, editing=True)
    delivery_options.add(p, editing=True)
    p.set_defaults(handler=destination_edit)

    p = command(destination, "show", help_="a destination's settings and delivery profile",
                description="A destination's SFTP settings and its delivery profile (the current version, or "
                            "--version N, which exports show names for each built file).", exits=(EXIT_NOT_FOUND,))
    _naming_one(p)
    p.add_argument("--version", type=positive_int(1_000_000), help="a past version of the profile")
    p.set_defaults(handler=destination_show)

    p = command(destination, "check", help_="probe what the partner's server allows, before exports depend on it",
                description="Connect as a delivery does (the pinned host keys, the credential) and probe, under "
                            "scratch dot-names in the remote directory that it removes again: write, exclusive "
                            "create, stat, lstat, listing, SETSTAT, rename, whether rename refuses an existing "
                            "target, posix-rename, check-file-name sha256; then how many sessions it accepts at once, "
                            "up to the destination's --max-sessions (each a login, as deliveries open them). Prints "
                            "what the server allows, the delivery modes that fit it and the one it recommends; "
                            "--apply records that one.",
                exits=(EXIT_NOT_FOUND, Exit(EXIT_REFUSED, "refused: the destination cannot be delivered to in any "
                                                          "mode (or cannot be reached or logged into), or --apply's "
                                                          "mode needs a completion marker the profile lacks; "
                                                          "nothing recorded")))
    _naming_one(p)
    p.add_argument("--apply", action="store_true", help="record the recommended delivery mode on the destination")
    p.add_argument("--probe-ingestion", nargs="?", const=delivery_options.INGESTION_WINDOW, default=None,
                   type=delivery_options.ingestion_window, metavar="SECONDS",
                   help="also publish one empty visible file, exports-check-<hex>.probe, and watch whether the "
                        "partner's ingestion takes it within SECONDS (default "
                        f"{delivery_options.INGESTION_WINDOW:g}); ask the partner first: their ingestion sees it")
    p.set_defaults(handler=destination_check)

    p = command(destination, "status", help_="each destination's circuit, sessions in use, deferred jobs",
                description="Each destination's circuit (closed, or open since when and until its next probe), "
                            "the sessions open to it now over every worker host, the jobs waiting out a "
                            "deferral, whether it is paused or draining (by whom, why) or its tenant paused and "
                            "the queued exports that holds, and the last error: the newer of the last connection "
                            "error and the newest failed export's cause.", exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", type=name, help="tenant id or exact name (default: every tenant)")
    p.set_defaults(handler=destination_status)

    p = command(destination, "check-credential", help_="resolve the credential reference and log in with it",
                description="Resolve the destination's credential reference in this environment (the workers' must "
                            "hold the same) and log in to its server with the pinned host keys, as a delivery "
                            "does; nothing is written to the server or recorded.",
                exits=(EXIT_NOT_FOUND, *credential_check.CHECK_EXITS))
    destination_pauses.add_naming(p, record=False)
    p.set_defaults(handler=destination_check_credential)
    keys = group(destination, "host-key", "the host keys a destination trusts (a partner rotating its key)")
    p = command(keys, "add", help_="pin one more host key the server may present",
                description="Pin one more host key for the destination, beside those pinned: a partner rotating "
                            "its key presents the new one from some moment, and either is accepted until the old "
                            "one is removed. From --host-key (one known_hosts line), or fetched with "
                            "--fetch-host-key and pinned only with --yes once checked with the partner.",
                exits=(EXIT_NOT_FOUND, Exit(EXIT_REFUSED, "refused: the fetched key is shown, not pinned, "
                                                          "without --yes")))
    _naming_one(p)
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--host-key", type=text(16384), help='one known_hosts line: "[host]:port keytype base64"')
    key.add_argument("--fetch-host-key", action="store_true", help="fetch the server's key now (needs --yes to pin)")
    p.add_argument("--yes", action="store_true", help="confirm pinning the fetched host key")
    p.set_defaults(handler=host_key_add)

    p = command(keys, "remove", help_="unpin a host key by its fingerprint (one always stays)",
                description="Unpin one of the destination's host keys, named by its SHA256 fingerprint as "
                            "`destination show` prints it. The last key is never removed.",
                exits=(EXIT_NOT_FOUND, Exit(EXIT_REFUSED, "refused: it is the destination's only pinned key")))
    _naming_one(p)
    p.add_argument("--fingerprint", required=True, type=text(100), help="SHA256:... of the key to unpin")
    p.set_defaults(handler=host_key_remove)
    for action, parser in destination_pauses.add(destination).items():
        parser.set_defaults(handler=PAUSE_HANDLERS[action])


def destination_pause(ctx: Context, args: argparse.Namespace) -> int:
    return destination_pauses.pause(ctx, args)


def destination_drain(ctx: Context, args: argparse.Namespace) -> int:
    return destination_pauses.drain(ctx, args)


def destination_resume(ctx: Context, args: argparse.Namespace) -> int:
    return destination_pauses.resume(ctx, args)


PAUSE_HANDLERS = {"pause": destination_pause, "drain": destination_drain, "resume": destination_resume}


def _by(args: argparse.Namespace) -> str:
    return operator_name(args.by)


def destination_add(ctx: Context, args: argparse.Namespace) -> int:
    credential_ref = _credential_ref(args.credential_ref)
    profile = profile_options.profile(args, Profile())
    delivery = delivery_options.for_new(args, profile)
    line, key = _host_key(args, args.host, args.port)
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    destination_id = uuid.uuid4()
    new = directory.NewDestination(
        tenant_id=tenant.id, name=args.name, host=args.host, port=args.port, username=args.username,
        remote_dir=args.remote_dir, host_key=line, credential_ref=credential_ref, remote_hash=args.remote_hash,
        acknowledgments=args.acknowledgments, name_and_size_identify=args.name_and_size_identify,
        read_back=args.read_back, max_sessions=args.max_sessions, auto_retries=args.auto_retries,
        profile=profile.to_json(), created_by=_by(args), **delivery)
    checked = "credential not checked (--no-check): run `destination check-credential` once the server is up"
    if not args.no_check:
        checked = "credential checked: " + credential_check.log_in(_config(new.__dict__), f"destination {args.name!r}")
    with ctx.connection() as conn:
        added = directory.add_destination(conn, destination_id=destination_id, destination=new)
        if added is directory.AddResult.UNKNOWN_TENANT:
            raise not_found(f"no tenant {tenant.id}")
    emit(ctx, f"destination {args.name!r} added to tenant {tenant.name!r}: {destination_id}\n"
              f"  pinned host key {key.get_name()} {fingerprint(key)}\n  {checked}\n"
              + "\n".join(f"  {line_}" for line_ in [*profile.describe(), *delivery_options.described(**delivery)]),
         {"destination_id": str(destination_id), "tenant_id": str(tenant.id), "host_key": line,
          "fingerprint": fingerprint(key), "profile_version": 1, "profile": profile.to_json(), **delivery,
          "credential_checked": not args.no_check})
    return EXIT_OK


def _config(row: dict[str, Any]) -> DestinationConfig:
    """The config a destination's row (or the row it would be) describes; bad input when it describes none."""
    try:
        return DestinationConfig.from_row(row)
    except DestinationError as exc:
        raise bad_input(f"the destination cannot be used: {exc}") from None


def _naming_one(p: argparse.ArgumentParser) -> None:
    """--tenant and --destination, which ``_named`` resolves."""
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")


def _named(ctx: Context, args: argparse.Namespace) -> tuple[Tenant, Destination]:
    """The tenant and the destination of its that ``--tenant`` and ``--destination`` name."""
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    return tenant, cli_lookup.destination(views, tenant, args.destination)


def destination_edit(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found = _named(ctx, args)
    credential_ref = _credential_ref(args.credential_ref) if args.credential_ref is not None else None
    with ctx.connection() as conn:
        current = directory.read_profile(conn, tenant_id=tenant.id, destination_id=found.id)
        row = directory.read_destination(conn, tenant_id=tenant.id, destination_id=found.id)
        if current is None or row is None:
            raise not_found(f"no destination {found.id} in tenant {tenant.name!r}")
        if args.expected_version is not None and args.expected_version != current.version:
            raise refused(f"destination {found.name!r}: its profile is v{current.version}, not "
                          f"v{args.expected_version}; nothing written")
        before = Profile.from_json(current.profile)
        after = profile_options.profile(args, before)
        delivery = delivery_options.changes(args, row, after)
        if credential_ref == row["credential_ref"]:
            credential_ref = None
        contract_was = {flag: row[flag] for flag in CONTRACT_FLAGS}
        contract = {flag: row[flag] if getattr(args, flag) is None else getattr(args, flag) for flag in CONTRACT_FLAGS}
        if after.to_json() == before.to_json() and delivery is None and credential_ref is None \
                and contract == contract_was:
            emit(ctx, f"destination {found.name!r}: profile v{current.version} already says that; nothing written",
                 {"destination_id": str(found.id), "profile_version": current.version, "changed": False})
            return EXIT_OK
        checked = None
        if credential_ref is not None and not args.no_check:
            checked = credential_check.log_in(_config({**row, "credential_ref": credential_ref}),
                                              f"destination {found.name!r}")
        version: int | None = current.version
        settings: dict[str, Any] | None = row
        # The profile, the delivery settings, the credential and the contract: all or nothing.
        with conn.transaction():
            if after.to_json() != before.to_json():
                edit, version = directory.edit_profile(conn, tenant_id=tenant.id, destination_id=found.id,
                                                       expected_version=current.version, profile=after.to_json(),
                                                       created_by=_by(args))
                if edit is directory.ProfileEdit.STALE:
                    raise refused(f"destination {found.name!r}: its profile changed after v{current.version} was "
                                  "read (another edit committed first); nothing written, run the edit again")
            if delivery is not None:
                settings = directory.set_delivery(conn, tenant_id=tenant.id, destination_id=found.id, **delivery)
                if settings is None:
                    raise refused(f"destination {found.name!r} changed meanwhile; nothing written, run the edit again")
            if credential_ref is not None and not edits.set_credential(
                    conn, tenant_id=tenant.id, destination_id=found.id, expected=row["credential_ref"],
                    credential_ref=credential_ref, changed_by=_by(args), reason=args.reason):
                raise refused(f"destination {found.name!r}: its credential reference changed meanwhile; nothing "
                              "written, run the edit again")
            if contract != contract_was and not edits.set_contract(
                    conn, tenant_id=tenant.id, destination_id=found.id, was=contract_was, now=contract,
                    changed_by=_by(args), reason=args.reason):
                raise refused(f"destination {found.name!r}: its contract flags changed meanwhile; nothing "
                              "written, run the edit again")
    assert settings is not None
    shown = delivery_options.described(settings["delivery_mode"], settings["bandwidth_limit"])
    lines = [*after.describe(), *shown]
    if delivery is not None and delivery["max_sessions"] is not None:
        lines.append(f"sessions at once: {settings['max_sessions']} (was {row['max_sessions']})")
    if credential_ref is not None:
        lines.append(f"credential {parse_credential_ref(credential_ref).shown} "
                     + (f"({checked})" if checked else "(not checked: --no-check)"))
    lines += [f"contract {flag}: {'yes' if contract[flag] else 'no'}" for flag in CONTRACT_FLAGS
              if contract[flag] != contract_was[flag]]
    emit(ctx, f"destination {found.name!r}: profile v{version}"
              + (f" (was v{current.version})" if version != current.version else " (unchanged)") + "\n"
              + "\n".join(f"  {line}" for line in lines),
         {"destination_id": str(found.id), "profile_version": version, "previous_version": current.version,
          "changed": True, "profile": after.to_json(), "delivery_mode": settings["delivery_mode"],
          "bandwidth_limit": settings["bandwidth_limit"], "max_sessions": settings["max_sessions"],
          "credential_changed": credential_ref is not None,
          "credential_checked": checked is not None, "contract": contract})
    return EXIT_OK


def _credential_ref(value: str) -> str:
    try:
        return str(parse_credential_ref(value))
    except CredentialError as exc:
        raise bad_input(f"credential reference: {exc}") from None


def destination_check_credential(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found = destination_pauses.named(ctx, args)
    with ctx.connection() as conn:
        row = directory.read_destination(conn, tenant_id=tenant.id, destination_id=found.id)
    if row is None:
        raise not_found(f"no destination {found.id} in tenant {tenant.name!r}")
    config = _config(row)
    checked = credential_check.log_in(config, f"destination {found.name!r}")
    emit(ctx, f"destination {found.name!r}: {checked}",
         {"destination_id": str(found.id), "host": config.host, "port": config.port, "username": config.username,
          "credential": config.credential.shown, "logged_in": True})
    return EXIT_OK


def destination_show(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found = _named(ctx, args)
    with ctx.connection() as conn:
        row = directory.read_destination(conn, tenant_id=tenant.id, destination_id=found.id)
        stored = directory.read_profile(conn, tenant_id=tenant.id, destination_id=found.id, version=args.version)
        pause = pausing.read_destination(conn, tenant_id=tenant.id, destination_id=found.id)
    if row is None or pause is None:
        raise not_found(f"no destination {found.id} in tenant {tenant.name!r}")
    if stored is None:
        raise not_found(f"destination {found.name!r} has no profile version {args.version}")
    profile = Profile.from_json(stored.profile)
    pinned = DestinationConfig.from_row(row).pinned_keys()
    settings: list[list[Any]] = [
                ["name", found.name], ["id", found.id], ["server", f"{row['username']}@{row['host']}:{row['port']}"],
                ["remote dir", row["remote_dir"]], ["credential", row["credential_ref"].split(":", 1)[0] + ":..."],
                ["sessions", row["max_sessions"]], ["auto retries", row["auto_retries"] or "off"],
                ["active", "yes" if row["active"] else "no"], ["paused", _pause_cell(pause)],
                ["host keys", ", ".join(pinned.fingerprints())], *delivery_options.shown(row)[0],
                ["profile", f"v{stored.version} of v{stored.current_version}, by {stored.created_by}, "
                            f"{stored.created_at:%Y-%m-%d %H:%M:%S}"]]
    human = table(["setting", "value"], settings) + "\n" + "\n".join(profile.describe())
    emit(ctx, human, {"destination_id": str(found.id), "tenant_id": str(tenant.id), "name": found.name,
                      "host": row["host"], "port": row["port"], "username": row["username"],
                      "remote_dir": row["remote_dir"], "host_key": row["host_key"],
                      "host_keys": [row["host_key"], *row["more_host_keys"]],
                      "host_key_fingerprints": pinned.fingerprints(), "max_sessions": row["max_sessions"],
                      "auto_retries": row["auto_retries"], "active": row["active"],
                      "profile_version": stored.version, "current_profile_version": stored.current_version,
                      "profile_created_by": stored.created_by, "profile_created_at": stored.created_at,
                      "profile": profile.to_json(), **delivery_options.shown(row)[1],
                      "contract": {flag: row[flag] for flag in CONTRACT_FLAGS},
                      "pause_state": pause.state.value if pause.state else "active", "paused_by": pause.paused_by,
                      "paused_reason": pause.paused_reason, "paused_at": pause.paused_at,
                      "tenant_paused": pause.tenant_paused_at is not None, "running": pause.running,
                      "queued": pause.queued})
    return EXIT_OK


def _pause_cell(pause: pausing.DestinationPause) -> str:
    if pause.state is not None:
        return (f"{pause.state.value} by {pause.paused_by} since {pause.paused_at:%Y-%m-%d %H:%M:%S}"
                + (f": {pause.paused_reason}" if pause.paused_reason else "")
                + (f" ({pause.running} attempts running)" if pause.running else ""))
    if pause.tenant_paused_at is not None:
        return f"no, but its tenant is (by {pause.tenant_paused_by})"
    return "no"


def destination_check(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found, config = _configured(ctx, args)
    try:
        found_caps = SftpDestination(config).check(ingestion_window=args.probe_ingestion)
    except (DestinationError, OSError, paramiko.SSHException) as exc:
        raise refused(f"destination {found.name!r} cannot be used: {describe(exc)}") from None
    return delivery_options.checked(ctx, args, tenant, found, config.delivery_mode, found_caps)


STATUS_HEADERS = ["tenant", "destination", "host", "circuit", "next probe", "failures", "sessions", "deferred",
                  "retries", "paused", "held", "last error"]


def _paused(d: partner.DestinationStatus) -> str | None:
    """The destination's pause as one cell: its state, who and why; or its tenant's."""
    if d.pause_state is not None:
        return f"{d.pause_state} by {d.paused_by}" + (f": {d.paused_reason}" if d.paused_reason else "")
    if d.tenant_paused_at is not None:
        return f"tenant paused by {d.tenant_paused_by}"
    return None


def destination_status(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant) if args.tenant else None
    with ctx.connection() as conn:
        found = partner.statuses(conn, tenant_id=tenant.id if tenant else None)
    rows = [[d.tenant_name, d.name, f"{d.host}:{d.port}", d.state + ("" if d.active else " (inactive)"),
             d.next_probe_at, d.failures or 0, f"{d.sessions_in_use}/{d.max_sessions}", d.deferred_jobs,
             d.auto_retries or "off", _paused(d), d.held_jobs, d.latest_error] for d in found]
    data = [{"destination_id": d.id, "tenant": d.tenant_name, "name": d.name, "host": d.host, "port": d.port,
             "active": d.active, "circuit": d.state, "opened_at": d.opened_at, "next_probe_at": d.next_probe_at,
             "failures": d.failures or 0, "sessions_in_use": d.sessions_in_use, "max_sessions": d.max_sessions,
             "deferred_jobs": d.deferred_jobs, "auto_retries": d.auto_retries, "last_error": d.latest_error,
             "last_connection_error": d.last_error, "last_failure": d.last_failure,
             "last_failure_at": d.last_failure_at, "pause_state": d.pause_state or "active",
             "paused_by": d.paused_by, "paused_reason": d.paused_reason, "paused_at": d.paused_at,
             "tenant_paused": d.tenant_paused_at is not None, "held_jobs": d.held_jobs}
            for d in found]
    emit(ctx, table(STATUS_HEADERS, rows) if found else "no destinations", data)
    return EXIT_OK


def _configured(ctx: Context, args: argparse.Namespace) -> tuple[Tenant, Destination, DestinationConfig]:
    """The named destination and the config its row describes."""
    tenant, found = _named(ctx, args)
    with ctx.connection() as conn:
        row = directory.read_destination(conn, tenant_id=tenant.id, destination_id=found.id)
    if row is None:
        raise not_found(f"no destination {found.id} in tenant {tenant.name!r}")
    try:
        return tenant, found, DestinationConfig.from_row(row)
    except DestinationError as exc:
        raise bad_input(f"destination {found.name!r} cannot be used as stored: {exc}") from None


def host_key_add(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found, config = _configured(ctx, args)
    line, key = _host_key(args, config.host, config.port)
    with ctx.connection() as conn:
        pinned = directory.add_host_key(conn, tenant_id=tenant.id, destination_id=found.id, line=line)
    if pinned is None:
        emit(ctx, f"destination {found.name!r}: {key.get_name()} {fingerprint(key)} is pinned already; nothing "
                  "changed", {"destination_id": str(found.id), "fingerprint": fingerprint(key), "changed": False})
        return EXIT_OK
    emit(ctx, f"destination {found.name!r}: pinned {key.get_name()} {fingerprint(key)} ({pinned} keys pinned)",
         {"destination_id": str(found.id), "fingerprint": fingerprint(key), "host_key": line, "pinned": pinned,
          "changed": True})
    return EXIT_OK


def host_key_remove(ctx: Context, args: argparse.Namespace) -> int:
    tenant, found, config = _configured(ctx, args)
    lines = dict(zip(config.pinned_keys().fingerprints(), (config.host_key, *config.more_host_keys), strict=True))
    wanted = args.fingerprint.strip()
    if wanted not in lines:
        raise not_found(f"destination {found.name!r} pins no key {wanted!r}; it pins {', '.join(lines)}")
    if len(lines) == 1:
        raise refused(f"{wanted} is destination {found.name!r}'s only pinned key: pin its successor first "
                      "(destination host-key add)")
    with ctx.connection() as conn:
        pinned = directory.remove_host_key(conn, tenant_id=tenant.id, destination_id=found.id, line=lines[wanted])
    if pinned is None:
        raise refused(f"destination {found.name!r}'s keys changed meanwhile; nothing removed, run it again")
    emit(ctx, f"destination {found.name!r}: unpinned {wanted} ({pinned} keys pinned)",
         {"destination_id": str(found.id), "fingerprint": wanted, "pinned": pinned})
    return EXIT_OK


def _host_key(args: argparse.Namespace, host: str, port: int) -> tuple[str, paramiko.PKey]:
    """The key ``--host-key`` gives, or the one the server presents with ``--fetch-host-key``, which is only
    shown (exit 4) until ``--yes`` confirms it was checked with the partner."""
    if not args.fetch_host_key:
        try:
            return parse_host_key(args.host_key, host, port)
        except HostKeyError as exc:
            raise bad_input(f"--host-key: {exc}") from None
    try:
        key = fetch_host_key(host, port, FETCH_HOST_KEY_TIMEOUT)
    except HostKeyError as exc:
        raise not_found(str(exc)) from None
    line = known_hosts_line(host, port, key)
    if not args.yes:
        raise refused(f"{host}:{port} presents {key.get_name()} {fingerprint(key)}; "
                      "check it with the partner and re-run with --yes to pin it",
                      host_key=line, fingerprint=fingerprint(key))
    return line, key


def _port(value: str) -> int:
    return positive_int(65535)(value)


_port.__name__ = "port"


def _retries(value: str) -> int:
    return 0 if value.strip() == "0" else positive_int(20)(value)


_retries.__name__ = "retries"
