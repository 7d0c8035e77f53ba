"""``exports demo``: the whole system on this machine through a scripted scenario (``exports_devtools.demo``).

A command the test equipment adds to ``exports`` through the ``exports.commands`` entry point.
"""

from __future__ import annotations

import argparse

from app.cli.common import EXIT_FAILURE, EXIT_REFUSED, Context, Exit, command

# The demo is imported by the command, not by its registration (see commands/chaos.py).


def register(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "demo", help_="run the whole system on this machine through a scripted scenario",
                description="Start the embedded services, relay, two workers and the scheduler, play a scenario, "
                            "print the outcome and stop everything (--keep leaves it running).", json_output=False,
                exits=(Exit(EXIT_FAILURE, "a scene did not go as it should (the logs say where), or a surprise"),
                       Exit(EXIT_REFUSED, "a demo started with --keep is still running")))
    p.add_argument("--keep", action="store_true", help="leave everything running and print the environment")
    p.add_argument("--stop", action="store_true", help="stop what a demo started with --keep left running")
    p.set_defaults(handler=demo, long_running=True)


def demo(ctx: Context, args: argparse.Namespace) -> int:
    from exports_devtools import demo as demo_module

    if args.stop:
        return demo_module.stop_kept(ctx)
    return demo_module.run(ctx, keep=args.keep)
