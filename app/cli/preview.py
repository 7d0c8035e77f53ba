"""``exports preview``: the first rows of a destination's file exactly as its partner would receive them,
before compression and encryption, built by the same code as an export's file; nothing is queued,
delivered or written to the database."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.actors import partner_file
from app.cli import lookup as cli_lookup
from app.cli.common import EXIT_NOT_FOUND, EXIT_OK, Context, bad_input, command, name, not_found, positive_int, text
from app.delivery.profile import Profile
from app.store import directory

#: Rows ``exports preview`` prints unless told otherwise, and at most.
PREVIEW_ROWS = 10
MAX_PREVIEW_ROWS = 10_000


def register(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "preview", help_="the first rows a destination's partner would receive (nothing queued)",
                description="Build the first rows of the file exactly as the destination's partner would receive "
                            "them, before compression (and encryption), from the tenant's consenting contacts, to "
                            "stdout or --output. Nothing is queued, delivered or written to the database.",
                exits=(EXIT_NOT_FOUND,), json_output=False)
    p.add_argument("--tenant", required=True, type=name, help="tenant id or exact name")
    p.add_argument("--destination", required=True, type=name, help="destination id or exact name")
    p.add_argument("--rows", type=positive_int(MAX_PREVIEW_ROWS), default=PREVIEW_ROWS,
                   help=f"how many contacts (default {PREVIEW_ROWS}, at most {MAX_PREVIEW_ROWS})")
    p.add_argument("--output", type=text(4096), help="a new file to write instead of stdout (never overwritten)")
    p.set_defaults(handler=preview)


def preview(ctx: Context, args: argparse.Namespace) -> int:
    views = ctx.views()
    tenant = cli_lookup.tenant(views, args.tenant)
    found = cli_lookup.destination(views, tenant, args.destination)
    target = Path(args.output) if args.output else None
    with ctx.connection() as conn:
        stored = directory.read_profile(conn, tenant_id=tenant.id, destination_id=found.id)
        if stored is None:
            raise not_found(f"no destination {found.id} in tenant {tenant.name!r}")
        profile = Profile.from_json(stored.profile)
        try:
            out = target.open("xb") if target is not None else sys.stdout.buffer
        except FileExistsError:
            raise bad_input(f"--output {target} exists; preview never overwrites a file") from None
        except OSError as exc:
            raise bad_input(f"--output {target}: {exc.strerror}") from None
        try:
            for block, _rows in partner_file.plaintext(conn, tenant.id, profile, 64 * 1024, limit=args.rows):
                out.write(block)
            out.flush()
        except BaseException:
            if target is not None:
                out.close()
                target.unlink(missing_ok=True)   # no half a preview left behind
            raise
        if target is not None:
            out.close()
    return EXIT_OK
