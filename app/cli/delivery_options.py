"""How a destination's files are published (``--delivery-mode``, ``--bandwidth-limit``) on ``destination add``
and ``edit``, as ``destination show`` prints them, and the report of ``destination check`` with the mode it
recommends and, with ``--apply``, records.

A delivery mode (``app.delivery.modes``) is a destination setting, not part of the delivery profile: it
says what the partner's server allows, not what the partner receives. Mode no-rename publishes a file by
its completion marker, so it is refused (exit 2) for a profile without one, and a profile edit that
drops the marker is refused while the mode is no-rename.
"""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.common import EXIT_OK, Context, bad_input, positive_int, refused
from app.cli.output import emit, table
from app.delivery import preflight
from app.delivery.config import MIN_BANDWIDTH_LIMIT
from app.delivery.modes import DeliveryMode
from app.delivery.preflight import Capabilities
from app.delivery.profile import Marker, Profile
from app.store import directory
from app.store.views import Destination, Tenant

#: The highest bandwidth limit accepted, in bytes per second (the schema's CHECK): 1 TB/s.
MAX_BANDWIDTH_LIMIT = 10**12
#: Seconds ``--probe-ingestion`` watches its published file unless told otherwise, and at most.
INGESTION_WINDOW = 5.0
MAX_INGESTION_WINDOW = 300.0
_UNITS = {"": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def add(p: argparse.ArgumentParser, *, editing: bool) -> None:
    """The options, on ``destination add`` (with their defaults) or ``edit`` (unchanged unless given)."""
    keep = " (default: unchanged)" if editing else ""
    options = p.add_argument_group("delivery: how files are published on the partner's server")
    options.add_argument("--delivery-mode", type=_mode, metavar="|".join(m.value for m in DeliveryMode),
                         help="; ".join(f"{m.value}: {m.reason}" for m in DeliveryMode)
                              + ". `destination check` recommends one (its --apply records it); no-rename needs a "
                                "completion marker (--marker)" + (keep or " (default standard)"))
    options.add_argument("--bandwidth-limit", type=_bandwidth, metavar="BYTES_PER_SECOND",
                         help=f"the partner's limit on our uploads: bytes per second, at least {MIN_BANDWIDTH_LIMIT} "
                              "(k, M, G for thousands; KiB, MiB, GiB for 1024s)" + (", or off" if editing else "")
                              + (keep or " (default: none)"))
    if editing:   # destination add has its own --max-sessions
        options.add_argument("--max-sessions", type=positive_int(64), metavar="N",
                             help="sessions the partner accepts at once, over every worker host (`destination check` "
                                  "counts them)" + keep)


def for_new(args: argparse.Namespace, profile: Profile) -> dict[str, Any]:
    """``NewDestination``'s delivery settings from ``destination add``'s options."""
    mode = args.delivery_mode or DeliveryMode.STANDARD
    _needs_marker(mode, profile)
    return {"delivery_mode": mode.value, "bandwidth_limit": args.bandwidth_limit or None}


def changes(args: argparse.Namespace, row: dict[str, Any], profile: Profile) -> dict[str, Any] | None:
    """What ``destination edit`` changes of the delivery settings (``directory.set_delivery``'s arguments),
    None when nothing; refuses, exit 2, a mode no-rename left without a completion marker."""
    current = DeliveryMode.of(row["delivery_mode"])
    mode = args.delivery_mode or current
    _needs_marker(mode, profile)
    new_mode = args.delivery_mode if args.delivery_mode not in (None, current) else None
    set_limit = args.bandwidth_limit is not None and (args.bandwidth_limit or None) != row["bandwidth_limit"]
    sessions = args.max_sessions if args.max_sessions not in (None, row["max_sessions"]) else None
    if new_mode is None and not set_limit and sessions is None:
        return None
    return {"delivery_mode": None if new_mode is None else new_mode.value, "set_limit": set_limit,
            "bandwidth_limit": args.bandwidth_limit or None, "max_sessions": sessions}


def described(delivery_mode: str, bandwidth_limit: int | None) -> list[str]:
    """The settings as ``destination add``, ``edit`` and ``show`` print them."""
    return [f"delivery mode: {delivery_mode} ({DeliveryMode.of(delivery_mode).reason})",
            f"bandwidth limit: {_shown_limit(bandwidth_limit)}"]


def shown(row: dict[str, Any]) -> tuple[list[list[Any]], dict[str, Any]]:
    """``destination show``'s rows and JSON fields."""
    return ([["delivery mode", row["delivery_mode"]], ["bandwidth", _shown_limit(row["bandwidth_limit"])]],
            {"delivery_mode": row["delivery_mode"], "bandwidth_limit": row["bandwidth_limit"]})


def checked(ctx: Context, args: argparse.Namespace, tenant: Tenant, found: Destination, mode: DeliveryMode,
            caps: Capabilities) -> int:
    """``destination check``'s report: what each probe found, the modes that fit, the one it recommends and
    the one recorded; with ``--apply`` the recommended mode recorded. Exit 0 when some mode can deliver,
    4 when none can (or ``--apply`` could not record it)."""
    rows = [[probe, {True: "yes", False: "no", None: "not probed"}[caps.found[probe]], meaning, caps.why.get(probe, "")]
            for probe, meaning in preflight.PROBES.items()]
    modes: dict[str, dict[str, Any]] = {m.value: {"fits": not caps.missing(m), "missing": caps.missing(m)}
                                        for m in DeliveryMode}
    recommended = caps.recommended
    recorded = mode.value
    data: dict[str, Any] = {
        "destination_id": str(found.id), "capabilities": caps.found, "why": caps.why, "modes": modes,
        "deliverable": caps.deliverable, "recommended": None if recommended is None else recommended.value,
        "recommendation": caps.verdict, "recorded_mode": recorded, "applied": False,
        "sessions": {"accepted": caps.sessions, "tried": caps.sessions_tried, "why": caps.sessions_why or None,
                     "advice": caps.session_advice or None}}
    lines = [table(["probe", "allowed", "what", "server said"], rows), "", _sessions_line(caps), "",
             table(["mode", "fits", "missing"], [[name, "yes" if m["fits"] else "no", ", ".join(m["missing"])]
                                                 for name, m in modes.items()]), "",
             f"recommended: {caps.verdict}", f"recorded: {recorded}"]
    if recommended is None:
        emit(ctx, "\n".join(lines), data)
        raise refused(f"destination {found.name!r} cannot be delivered to in any mode ({caps.verdict})", **data)
    if args.apply and recommended.value != recorded:
        if _apply(ctx, tenant, found, recommended) is None:
            emit(ctx, "\n".join(lines), data)
            raise refused(f"destination {found.name!r}: mode {recommended.value} publishes a file by its completion "
                          "marker, and the profile writes none: set one (destination edit --marker done or manifest) "
                          "and run check --apply again; nothing recorded", **data)
        data.update(applied=True, recorded_mode=recommended.value, previous_mode=recorded)
        lines[-1] = f"recorded: {recommended.value} (was {recorded})"
    elif recommended.value != recorded:
        lines.append(f"the destination records {recorded}: run with --apply to record {recommended.value}")
    emit(ctx, "\n".join(lines), data)
    return EXIT_OK


def _sessions_line(caps: Capabilities) -> str:
    if caps.sessions is None:
        return "sessions at once: not probed (an earlier step failed)"
    return f"sessions at once: {caps.sessions} of {caps.sessions_tried} tried" + (
        f"; {caps.session_advice}" if caps.session_advice else " (the destination's --max-sessions fits)")


def _apply(ctx: Context, tenant: Tenant, found: Destination, mode: DeliveryMode) -> dict[str, Any] | None:
    with ctx.connection() as conn:
        return directory.set_delivery(conn, tenant_id=tenant.id, destination_id=found.id, delivery_mode=mode.value,
                                      set_limit=False, bandwidth_limit=None)


def _needs_marker(mode: DeliveryMode, profile: Profile) -> None:
    if mode.needs_marker and profile.marker is Marker.NONE:
        raise bad_input(f"delivery mode {mode.value} publishes a file by its completion marker: the profile needs one "
                        "(--marker done or manifest)")


def _shown_limit(limit: int | None) -> str:
    return "none" if limit is None else f"{limit} bytes/s"


def _mode(value: str) -> DeliveryMode:
    try:
        return DeliveryMode(value.strip().lower())
    except ValueError:
        raise argparse.ArgumentTypeError(f"one of {', '.join(m.value for m in DeliveryMode)}") from None


_mode.__name__ = "delivery mode"


def _bandwidth(value: str) -> int:
    """Bytes per second, with an optional unit; 0 or ``off`` for none (``edit``'s way to remove a limit)."""
    text = value.strip().lower()
    if text in ("off", "0"):
        return 0
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz/")
    unit = text[len(number):].removesuffix("/s")
    if unit not in _UNITS or not number.isdigit() or len(number) > 13:
        raise argparse.ArgumentTypeError("bytes per second: digits with an optional k, M, G, KiB, MiB or GiB")
    limit = int(number) * _UNITS[unit]
    if not MIN_BANDWIDTH_LIMIT <= limit <= MAX_BANDWIDTH_LIMIT:
        raise argparse.ArgumentTypeError(f"between {MIN_BANDWIDTH_LIMIT} bytes/s and 1 TB/s")
    return limit


_bandwidth.__name__ = "bandwidth limit"


def ingestion_window(value: str) -> float:
    """``--probe-ingestion``'s seconds."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("seconds") from None
    if not 0 < seconds <= MAX_INGESTION_WINDOW:
        raise argparse.ArgumentTypeError(f"seconds, more than 0 and at most {MAX_INGESTION_WINDOW:g}")
    return seconds


ingestion_window.__name__ = "seconds"
