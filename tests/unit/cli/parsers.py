"""The parser tree of ``exports``, as the tests walk it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def leaves(parser: argparse.ArgumentParser,
           prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command that runs a handler (``db migrate``, ``cancel``...), by its path of names."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for name, sub in action.choices.items():
            if sub._subparsers:
                yield from leaves(sub, prefix + (name,))
            else:
                yield prefix + (name,), sub
