"""gpg itself: finding the binary, a GNUPGHOME of our own with python-gnupg's handle on it (``Home``), a
throwaway home for a one-off check, and reading gpg's status lines. Every other module of the package runs gpg
through here."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import gnupg

from app import logs
from app.delivery.errors import OpenPGPError

log = logs.get(__name__)

#: A partner key with more than this is not a partner key (a key with every signature it ever got is ~100 KB).
MAX_KEY_TEXT = 1 << 20
#: How long a key operation (import, listing, test signature) may take before it is a failure.
_KEY_TIMEOUT = 60.0
#: Status keywords worth quoting when gpg fails (they carry codes, key ids and fingerprints, never data).
_FAILURE_STATUSES = {"INV_RECP", "INV_SGNR", "NO_RECP", "NO_SGNR", "KEYEXPIRED", "KEYREVOKED", "FAILURE",
                     "ERROR", "MISSING_PASSPHRASE", "BAD_PASSPHRASE"}


def _gpg_binary() -> str:
    found = shutil.which("gpg")
    if found is None:
        raise OpenPGPError("gpg (GnuPG 2.1 or later) is not installed on this host")
    return found


class Home:
    """A GNUPGHOME of our own and the python-gnupg handle on it. ``agent``: whether gpg may start a gpg-agent
    there (only a home holding our secret key needs one; the others run with ``--no-autostart``)."""

    def __init__(self, path: Path, *, agent: bool) -> None:
        self.path = path
        self.agent = agent
        self.env = {**os.environ, "GNUPGHOME": str(path)}
        options = ["--no-random-seed-file", "--no-auto-check-trustdb", "--no-auto-key-retrieve"]
        # error: gpg-agent answers "no pinentry" instead of asking anyone for a passphrase.
        options += ["--pinentry-mode", "error"] if agent else ["--no-autostart"]
        try:
            self.gpg = gnupg.GPG(gpgbinary=_gpg_binary(), gnupghome=str(path), options=options, env=self.env,
                                 encoding="utf-8")
        except (OSError, ValueError):
            raise OpenPGPError("gpg could not be run on this host") from None
        self.gpg.decode_errors = "replace"
        if self.gpg.version is None or tuple(self.gpg.version) < (2, 1):
            raise OpenPGPError("gpg is older than GnuPG 2.1 on this host")

    def command(self, args: list[str]) -> list[str]:
        """The gpg command line python-gnupg builds for this home (``--batch``, ``--no-tty``, status on fd 2)."""
        return list(self.gpg.make_args(args, False))

    def run(self, args: list[str], data: bytes) -> tuple[int, list[tuple[str, str]]]:
        """Runs gpg on ``data`` through our own pipe; its return code and status lines (stdout discarded)."""
        try:
            done = subprocess.run(self.command(args), input=data, capture_output=True, env=self.env,
                                  timeout=_KEY_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise OpenPGPError(f"gpg took longer than {_KEY_TIMEOUT:.0f}s over a key") from None
        return done.returncode, parse_statuses(done.stderr)

    def remove(self) -> None:
        """Stops the home's gpg-agent, if it may have one, and removes the home. Never raises."""
        if self.agent:
            gpgconf = shutil.which("gpgconf") or str(Path(_gpg_binary()).with_name("gpgconf"))
            try:
                subprocess.run([gpgconf, "--homedir", str(self.path), "--kill", "gpg-agent"], input=b"",
                               capture_output=True, env=self.env, timeout=10, check=False)
            except (OSError, subprocess.SubprocessError) as exc:
                # The agent also ends by itself once its socket is removed with the home.
                log.warning("openpgp.agent_not_stopped", error=type(exc).__name__)
        shutil.rmtree(self.path, ignore_errors=True)


@contextmanager
def throwaway_home(*, agent: bool) -> Iterator[Home]:
    """A home of its own for one check, under a new private temporary directory, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"exports-openpgp-{os.getpid()}-check-"))   # 0700
    try:
        home = Home(path, agent=agent)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        yield home
    finally:
        home.remove()


def parse_statuses(stderr: bytes) -> list[tuple[str, str]]:
    """gpg's status lines (``[GNUPG:] WORD value``) in what it wrote to its status fd: (word, value) pairs."""
    found = []
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.startswith("[GNUPG:] "):
            word, _, value = line[9:].partition(" ")
            found.append((word, value.strip()))
    return found


def status_detail(statuses: Sequence[tuple[str, str]]) -> str:
    """The statuses worth quoting when gpg fails, in one line (codes, key ids, fingerprints: never data)."""
    detail = [f"{word} {value}".strip() for word, value in statuses if word in _FAILURE_STATUSES]
    return ", ".join(detail) or "no status"


def listing_time(field_value: str | None) -> datetime | None:
    """A colon listing's time (seconds since the epoch; empty for never)."""
    return datetime.fromtimestamp(int(field_value), UTC) if field_value and field_value.isdigit() else None
