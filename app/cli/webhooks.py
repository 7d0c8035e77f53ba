"""A tenant's webhooks (add, list, show, remove, redeliver, test, new-secret): their parsers and handlers.

An endpoint is an HTTPS URL (plain http only for a loopback receiver, with --allow-http) and a
*reference* to its signing secret (``env:NAME`` or ``file:/path``), never the secret: the notifier reads
it when it signs. Every outcome of the tenant's exports from then on is sent to it by ``exports notifier``
(docs/operations.md, "Webhooks"). These are for administrators; no operator grant is checked.
"""

from __future__ import annotations

import argparse
import ipaddress
import uuid
from datetime import UTC, datetime
from urllib.parse import urlsplit

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
    printable,
    refused,
    text,
)
from app.cli.output import emit, table
from app.store import webhooks as store
from app.store.views import Tenant
from app.webhooks import payload, signing

#: Deliveries ``webhook show`` lists unless told otherwise.
RECENT = 20
#: Host names that are the loopback without a lookup.
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


def register(commands: argparse._SubParsersAction) -> None:
    webhook = group(commands, "webhook", "tenants' webhooks: endpoints told every export's outcome")
    p = command(webhook, "add", help_="register a tenant's endpoint and the reference to its signing secret",
                description="Register an HTTPS endpoint for the tenant: from now on every outcome of its exports "
                            "(Completed, Failed, Stopped, Canceled, Rejected, OutcomeUnknown) is POSTed to it by "
                            "exports notifier, signed with the secret --secret-ref names (env:NAME or "
                            "file:/path, read by the notifier when it signs; never the secret itself). Plain "
                            "http is refused unless --allow-http is given, and then only for a loopback host.",
                exits=(Exit(EXIT_NOT_FOUND, "not found: no such tenant"),
                       Exit(EXIT_REFUSED, "refused: the tenant has a live endpoint of that name")))
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--name", required=True, type=name, help="the endpoint's name, unique among the tenant's")
    p.add_argument("--url", required=True, type=text(2048), help="https://... (http://127.0.0.1... with --allow-http)")
    p.add_argument("--secret-ref", required=True, type=text(1024),
                   help="env:NAME or file:/path holding whsec_<base64> (exports webhook new-secret makes one)")
    p.add_argument("--allow-http", action="store_true", help="allow plain http to a loopback receiver (tests)")
    p.add_argument("--by", type=name, help="who adds it (default: this login's name)")
    p.set_defaults(handler=webhook_add)

    p = command(webhook, "list", help_="the endpoints, with what each is owed and its last answer",
                description="Each live endpoint (of --tenant, or of every tenant): its URL, the events still owed "
                            "to it and since when, the ones given up (dead), and the answer to its newest request.",
                exits=(EXIT_NOT_FOUND,))
    p.add_argument("--tenant", type=name, help="tenant id or exact name (default: every tenant)")
    p.set_defaults(handler=webhook_list)

    p = command(webhook, "show", help_="one endpoint and its newest deliveries",
                description="An endpoint's settings and its newest deliveries: the export, the outcome, the sending "
                            "state (pending, delivered, dead, dropped), the attempts and the last answer.",
                exits=(EXIT_NOT_FOUND,))
    _naming_one(p)
    p.add_argument("--limit", type=positive_int(1000), default=RECENT, help=f"deliveries listed (default {RECENT})")
    p.set_defaults(handler=webhook_show)

    p = command(webhook, "remove", help_="stop telling an endpoint (what it is still owed is dropped)",
                description="Remove the endpoint: no later outcome is queued for it, and the events still owed to it "
                            "are dropped by the notifier (recorded as dropped, never sent). Its history is kept.",
                exits=(EXIT_NOT_FOUND,))
    _naming_one(p)
    p.add_argument("--by", type=name, help="who removes it (default: this login's name)")
    p.set_defaults(handler=webhook_remove)

    p = command(webhook, "redeliver", help_="send again what the notifier gave up (dead deliveries)",
                description="Every event the notifier gave up on for this endpoint (state dead: its receiver "
                            "answered no 2xx until the give-up horizon) since --since becomes pending again, due at "
                            "once, under its own id (a receiver that got it after all deduplicates on the id); its "
                            "horizon counts from now. Delivered, dropped and pending events are left as they are. "
                            "--dry-run lists what would be sent again and changes nothing.",
                exits=(Exit(EXIT_NOT_FOUND, "not found: no such tenant, or no such live webhook of it"),))
    _naming_one(p)
    p.add_argument("--since", type=text(64), default=None,
                   help="only events that occurred at or after this ISO 8601 time (UTC unless it says; default: all)")
    p.add_argument("--by", type=name, help="who sends them again (default: this login's name)")
    p.add_argument("--dry-run", action="store_true", help="list what would be sent again; change nothing")
    p.set_defaults(handler=webhook_redeliver)

    p = command(webhook, "test", help_="send a signed test request to the endpoint now",
                description="POST a signed request of type webhook.test to the endpoint from this shell, with the "
                            "secret its reference names here, and print the answer. Nothing is recorded, and no "
                            "export's event is sent.",
                exits=(EXIT_NOT_FOUND, Exit(EXIT_REFUSED, "refused: the receiver did not answer 2xx, or the secret "
                                                          "cannot be read here")))
    _naming_one(p)
    p.set_defaults(handler=webhook_test)

    p = command(webhook, "new-secret", help_="print a new signing secret (whsec_...)",
                description="Print a new random signing secret in the Standard Webhooks form (whsec_ and the base64 "
                            "of 32 random bytes). Store it where --secret-ref points, and give it to the tenant.")
    p.set_defaults(handler=webhook_new_secret)


def _naming_one(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--webhook", required=True, type=name, help="the endpoint's id or name")


def _checked_url(url: str, allow_http: bool) -> str:
    """The URL, if a notifier may post to it: https, or http to a loopback host with --allow-http; a host,
    and no credentials in it (a secret travels by reference only)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port   # noqa: B018 (a port out of range raises here)
    except ValueError:
        raise bad_input("--url is not a URL") from None
    if parts.scheme not in ("https", "http") or not host:
        raise bad_input("--url must be https://host/...")
    if parts.username is not None or parts.password is not None:
        raise bad_input("--url must not carry credentials: the signing secret is the endpoint's proof")
    if parts.fragment:
        raise bad_input("--url must not have a #fragment")
    if parts.scheme == "http":
        if not allow_http:
            raise bad_input("--url must be https; plain http is allowed only with --allow-http, for a loopback "
                            "receiver")
        if not _loopback(host):
            raise bad_input(f"--allow-http is for a loopback receiver only, not {printable(host, 80)}")
    return url


def _loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def webhook_add(ctx: Context, args: argparse.Namespace) -> int:
    url = _checked_url(args.url, args.allow_http)
    try:
        secret_ref = str(signing.parse_secret_ref(args.secret_ref))
    except signing.SecretError as exc:
        raise bad_input(f"--secret-ref: {exc}") from None
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    endpoint_id = uuid.uuid4()
    new = store.NewEndpoint(tenant_id=tenant.id, name=args.name, url=url, secret_ref=secret_ref,
                            created_by=operator_name(args.by), allow_http=url.startswith("http://"))
    with ctx.connection() as conn:
        added = store.add_endpoint(conn, endpoint_id=endpoint_id, endpoint=new)
    if added is store.AddResult.UNKNOWN_TENANT:
        raise not_found(f"no tenant {tenant.id}")
    if added is store.AddResult.NAME_TAKEN:
        raise refused(f"tenant {tenant.name!r} already has a webhook named {printable(args.name, 80)!r}")
    emit(ctx, f"webhook {args.name!r} added to tenant {tenant.name!r}: {endpoint_id}\n"
              f"  every outcome of its exports is sent to {printable(url, 200)} by exports notifier,\n"
              f"  signed with the secret {secret_ref} names in the notifier's environment",
         {"webhook_id": str(endpoint_id), "tenant_id": str(tenant.id), "name": args.name, "url": url,
          "secret_ref": secret_ref})
    return EXIT_OK


def _one(ctx: Context, tenant: Tenant, value: str) -> store.Endpoint:
    """One of the tenant's live endpoints, by id or name; another tenant's looks like a missing one."""
    try:
        endpoint_id: uuid.UUID | None = uuid.UUID(value)
    except ValueError:
        endpoint_id = None
    with ctx.connection() as conn:
        found = store.find_endpoints(conn, tenant_id=tenant.id, endpoint_id=endpoint_id,
                                     name=None if endpoint_id else value)
    if not found:
        raise not_found(f"no webhook {printable(value, 80)!r} in tenant {tenant.name!r}")
    return found[0]


def _summary_row(s: store.EndpointSummary) -> dict:
    e = s.endpoint
    return {"webhook_id": str(e.id), "tenant_id": str(e.tenant_id), "tenant": s.tenant_name, "name": e.name,
            "url": e.url, "secret_ref": e.secret_ref, "created_by": e.created_by, "created_at": e.created_at,
            "pending": s.pending, "oldest_pending": s.oldest_pending, "dead": s.dead, "newest_event": s.newest_event,
            "last_result": s.last_result}


def webhook_list(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant) if args.tenant else None
    with ctx.connection() as conn:
        found = store.list_endpoints(conn, tenant_id=tenant.id if tenant else None)
    rows = [[s.tenant_name, s.endpoint.name, s.endpoint.url, s.pending, s.oldest_pending, s.dead, s.last_result]
            for s in found]
    emit(ctx, table(["tenant", "webhook", "url", "pending", "oldest pending", "dead", "last answer"], rows)
         if rows else "no webhooks", [_summary_row(s) for s in found])
    return EXIT_OK


def webhook_show(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    endpoint = _one(ctx, tenant, args.webhook)
    with ctx.connection() as conn:
        summary = next(s for s in store.list_endpoints(conn, tenant_id=tenant.id) if s.endpoint.id == endpoint.id)
        recent = store.recent_deliveries(conn, endpoint_id=endpoint.id, limit=args.limit)
    head = (f"webhook {endpoint.name!r} of tenant {tenant.name!r}: {endpoint.id}\n"
            f"  url         {printable(endpoint.url, 200)}\n"
            f"  secret      {endpoint.secret_ref}\n"
            f"  added       {endpoint.created_at:%Y-%m-%d %H:%M:%S} by {endpoint.created_by}\n"
            f"  pending     {summary.pending}" + (f" (oldest since {summary.oldest_pending:%Y-%m-%d %H:%M:%S})"
                                                 if summary.oldest_pending else "") + "\n"
            f"  dead        {summary.dead}\n")
    rows = [[d.occurred_at, d.job_id, d.status + (f" {d.failure_reason}" if d.failure_reason else ""), d.source,
             d.state, d.attempts, d.last_result] for d in recent]
    body = table(["occurred", "export", "outcome", "recorded by", "state", "attempts", "last answer"], rows) \
        if rows else "no deliveries yet"
    emit(ctx, head + body, {**_summary_row(summary), "deliveries": [
        {"event_id": str(d.id), "export_id": str(d.job_id), "status": d.status, "failure_reason": d.failure_reason,
         "recorded_by": d.source, "occurred_at": d.occurred_at, "state": d.state, "attempts": d.attempts,
         "next_attempt_at": d.next_attempt_at, "finished_at": d.finished_at, "last_result": d.last_result}
        for d in recent]})
    return EXIT_OK


def webhook_remove(ctx: Context, args: argparse.Namespace) -> int:
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    endpoint = _one(ctx, tenant, args.webhook)
    with ctx.connection() as conn:
        removed = store.remove_endpoint(conn, tenant_id=tenant.id, endpoint_id=endpoint.id,
                                        removed_by=operator_name(args.by))
    if not removed:
        raise not_found(f"no webhook {printable(args.webhook, 80)!r} in tenant {tenant.name!r}")
    emit(ctx, f"webhook {endpoint.name!r} removed from tenant {tenant.name!r}: no later outcome is sent to it",
         {"webhook_id": str(endpoint.id), "removed": True})
    return EXIT_OK


def webhook_redeliver(ctx: Context, args: argparse.Namespace) -> int:
    since = _since(args.since)
    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    endpoint = _one(ctx, tenant, args.webhook)
    with ctx.connection() as conn:
        if args.dry_run:
            found = store.dead_deliveries(conn, tenant_id=tenant.id, endpoint_id=endpoint.id, since=since)
        else:
            found = store.redeliver(conn, tenant_id=tenant.id, endpoint_id=endpoint.id, since=since,
                                    revived_by=operator_name(args.by))
    verb = "would send again" if args.dry_run else "sends again"
    head = f"webhook {endpoint.name!r} of tenant {tenant.name!r}: the notifier {verb} {len(found)} given-up event(s)"
    rows = [[g.occurred_at, g.id, g.job_id, g.status] for g in found]
    emit(ctx, head + ("\n" + table(["occurred", "event", "export", "outcome"], rows) if rows else ""),
         {"webhook_id": str(endpoint.id), "dry_run": args.dry_run, "count": len(found),
          "events": [{"event_id": str(g.id), "export_id": str(g.job_id), "status": g.status,
                      "occurred_at": g.occurred_at} for g in found]})
    return EXIT_OK


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise bad_input(f"--since is not an ISO 8601 time: {printable(value, 60)!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def webhook_test(ctx: Context, args: argparse.Namespace) -> int:
    # urllib3 is imported by the one command that posts, not by every exports command.
    from app.webhooks.client import Poster

    tenant = cli_lookup.tenant(ctx.views(), args.tenant)
    endpoint = _one(ctx, tenant, args.webhook)
    try:
        keys = signing.resolve(endpoint.secret_ref)
    except signing.SecretError as exc:
        raise refused(f"the signing secret cannot be read in this shell: {exc}") from None
    event_id = uuid.uuid4()
    body = payload.probe(event_id, tenant.id, endpoint.id, endpoint.name, datetime.now(UTC))
    poster = Poster(timeout_seconds=ctx.settings.webhook_timeout_seconds)
    try:
        answer = poster.post(endpoint.url, body, signing.headers(keys, str(event_id), body))
    finally:
        poster.close()
    data = {"webhook_id": str(endpoint.id), "event_id": str(event_id), "delivered": answer.delivered,
            "http_status": answer.http_status, "error": answer.error, "seconds": round(answer.seconds, 3)}
    if not answer.delivered:
        raise refused(f"webhook {endpoint.name!r} did not take the test request: {answer.result}", **data)
    emit(ctx, f"webhook {endpoint.name!r} answered {answer.result} in {answer.seconds:.2f} s "
              f"(test request {event_id})", data)
    return EXIT_OK


def webhook_new_secret(ctx: Context, args: argparse.Namespace) -> int:
    secret = signing.new_secret()
    emit(ctx, secret, {"secret": secret})
    return EXIT_OK
