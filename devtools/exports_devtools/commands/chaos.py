"""``exports chaos``: the soak that proves the promises hold while things break (devtools/exports_devtools/chaos).

A command the test equipment adds to ``exports`` through the ``exports.commands`` entry point; a
production install, which lacks the equipment, has no such command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.cli.common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, CliError, Context, Exit, command, printable

# The soak and its faults are imported by the command, not by its registration: every ``exports``
# command registers the plugins, and importing the soak there would import dramatiq into a worker
# before ``exports worker`` sets the idle poll dramatiq reads on import.


def _positive(kind: str, maximum: float):
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {printable(value, 60)!r}") from None
        if not 0 < number <= maximum:
            raise argparse.ArgumentTypeError(f"must be above 0 and at most {maximum:g}")
        return number

    parse.__name__ = kind
    return parse


def _seed(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {printable(value, 60)!r}") from None


_seed.__name__ = "seed"


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {printable(value, 60)!r}") from None
    if not 0 <= number <= 1000:
        raise argparse.ArgumentTypeError("must be from 0 to 1000")
    return number


_count.__name__ = "count"


def register(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "chaos", help_="soak the whole system under load and faults, then check every promise",
                description="Start the whole system (embedded services unless --database-url/--broker-url), create "
                            "exports continuously, cancel, edit, replace and reconcile some, inject faults on a "
                            "seeded schedule, let it settle and check every invariant from the database and the "
                            "partner's directory. Prints progress on stderr and a report (--json: the whole "
                            "report on stdout); exit 0 only with no violation. docs/reliability.md explains it.",
                exits=(Exit(EXIT_FAILURE, "a promise was broken (the report says which), or a surprise"),))
    p.add_argument("--minutes", type=_positive("minutes", 24 * 60), default=3.0,
                   help="how long faults and load run (default 3)")
    p.add_argument("--rate", type=_positive("rate", 100), default=1.0, help="exports created per second (default 1)")
    p.add_argument("--seed", type=_seed, default=1, help="seeds the schedule of exports, actions and faults")
    p.add_argument("--faults", default="", metavar="KIND,...",
                   help="only these fault kinds (default every kind; `--faults list` names them)")
    p.add_argument("--faults-per-minute", type=_positive("faults per minute", 10_000), default=60.0,
                   help="faults injected per minute over all kinds (default 60)")
    p.add_argument("--at-least", type=_count, default=0, metavar="N",
                   help="past --minutes, keep injecting the kinds injected fewer than N times (the others stop) "
                        "until each has N or --max-minutes pass: a loaded machine makes fewer moments for the "
                        "kinds that wait for an upload or a rename (default 0: stop at --minutes)")
    p.add_argument("--max-minutes", type=_positive("minutes", 24 * 60), default=None,
                   help="with --at-least, the longest faults and load run in all (default: twice --minutes)")
    p.add_argument("--settle-minutes", type=_positive("minutes", 120), default=5.0,
                   help="longest wait for the system to settle after the faults stop (default 5)")
    p.add_argument("--grace", type=_positive("seconds", 600), default=10.0,
                   help="seconds the liveness watch allows beyond a lease plus a recovery interval, for a "
                        "loaded machine (default 10)")
    p.add_argument("--database-url", default=None, metavar="URL",
                   help="a PostgreSQL server (as a user that may create databases) where the soak makes its own "
                        "database; default: the embedded one")
    p.add_argument("--broker-url", default=None, metavar="URL",
                   help="a Redis for the soak's broker; default: the embedded one")
    p.add_argument("--partner-files", action="store_true",
                   help="both destinations deliver gzip encrypted with OpenPGP (to a partner key made for the soak) "
                        "and a manifest after each file (needs gpg)")
    p.add_argument("--report", default=None, metavar="PATH", help="where to write the JSON report "
                   "(default EXPORTS_STATE_DIR/chaos/report-<time>.json)")
    p.set_defaults(handler=chaos, long_running=True)


def chaos(ctx: Context, args: argparse.Namespace) -> int:
    from exports_devtools.chaos import run as soak
    from exports_devtools.chaos.faults import KINDS

    if args.faults.strip() == "list":
        print("\n".join(KINDS))
        return EXIT_OK
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip()) or tuple(KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise CliError(EXIT_BAD_INPUT, f"unknown fault kind {printable(unknown[0], 60)!r}; one of: {', '.join(KINDS)}")
    options = soak.SoakOptions(minutes=args.minutes, rate=args.rate, seed=args.seed, kinds=kinds,
                               faults_per_minute=args.faults_per_minute, settle_minutes=args.settle_minutes,
                               grace_seconds=args.grace, database_url=args.database_url,
                               broker_url=args.broker_url, report_path=Path(args.report) if args.report else None,
                               partner_files=args.partner_files, at_least=args.at_least,
                               max_minutes=args.max_minutes if args.max_minutes is not None else 2 * args.minutes)
    report, path = soak.run(ctx.settings, options)
    if ctx.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print("\n".join(soak.summary(report)))
        print(f"report: {path}")
    return EXIT_OK if report["ok"] else EXIT_FAILURE
