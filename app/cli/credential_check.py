"""The credential check of ``destination add``, ``destination edit --credential`` and ``destination
check-credential``: the reference resolved here, and a login with the pinned host keys, before anything is
recorded. A reference that does not resolve is bad input (2); a server that refuses the login, or presents a
key that is not pinned, answers ``EXIT_LOGIN_REFUSED``; one that cannot be reached ``EXIT_UNREACHABLE``.
``--no-check`` skips it, for a destination whose server is not reachable yet.
"""

from __future__ import annotations

import argparse

from app.cli.common import EXIT_LOGIN_REFUSED, EXIT_UNREACHABLE, CliError, Exit, bad_input
from app.delivery.config import DestinationConfig
from app.delivery.destination import Destination
from app.delivery.errors import CredentialError
from app.store.types import FailureCause

#: What the check's own answers mean, for the ``--help`` of each command that runs it.
CHECK_EXITS = (
    Exit(EXIT_LOGIN_REFUSED, "login refused: the partner's server refused the credential, or presented a host "
                             "key that is not pinned; nothing written"),
    Exit(EXIT_UNREACHABLE, "unreachable: the partner's server could not be reached to check the credential; "
                           "nothing written (--no-check records it unchecked)"),
)


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check", action="store_true",
                   help="record the credential reference without resolving it and logging in (for a server not "
                        "reachable yet; run `destination check-credential` once it is)")


def log_in(config: DestinationConfig, what: str) -> str:
    """Resolves ``config``'s credential here and logs in; answers how, or ends the command with its code.
    ``what`` names the destination in the answer."""
    try:
        failed = Destination(config).log_in()
    except CredentialError as exc:
        raise bad_input(f"{what}: {exc} in this environment (the workers' must hold it too); nothing written") \
            from None
    if failed is None:
        return f"logged in to {config.host}:{config.port} as {config.username} with {config.credential.shown}"
    if failed.cause is FailureCause.TRANSIENT:
        raise CliError(EXIT_UNREACHABLE, f"{what}: {config.host}:{config.port} cannot be reached to check the "
                                         f"credential: {failed.detail}; nothing written")
    raise CliError(EXIT_LOGIN_REFUSED, f"{what}: {config.host}:{config.port} refused the login as "
                                       f"{config.username}: {failed.detail}; nothing written")
