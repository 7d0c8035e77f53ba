"""Credential references, and their resolution to the secret they point at.

A destination row and the CLI hold a *reference* to the secret (``env:NAME``, ``keyfile:/path``,
``env-keyfile:NAME``), never the secret itself. This module is the one place that decides what a
well-formed reference is, and the one place that reads the secret, only when a connection needs it.

Two rules keep the secret out of logs, errors and the database: a malformed reference is never
echoed back (it may be a password pasted in the wrong place), and the resolved ``Credential`` shows
no secret in its repr. ``redact`` is the second line of defence for text a library produced.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from app.delivery.errors import CredentialError

#: What replaces a secret found in a message.
REDACTED = "***"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MALFORMED = ("a credential reference must be env:NAME, keyfile:/absolute/path or env-keyfile:NAME "
              "(a reference to the secret, never the secret)")


class CredentialKind(enum.StrEnum):
    """How a credential reference points at the secret."""

    #: ``env:NAME``: the password is in environment variable NAME.
    ENV = "env"
    #: ``keyfile:/path``: an unencrypted private key file, by absolute path.
    KEYFILE = "keyfile"
    #: ``env-keyfile:NAME``: environment variable NAME holds the absolute path of a private key file.
    ENV_KEYFILE = "env-keyfile"


@dataclass(frozen=True)
class CredentialRef:
    """A parsed, well-formed reference. Not a secret, but its target is shown only where needed."""

    kind: CredentialKind
    #: An environment variable name (``env``, ``env-keyfile``) or an absolute path (``keyfile``).
    target: str

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.target}"

    @property
    def shown(self) -> str:
        """The reference as a repr shows it: its kind only, since reprs travel into logs."""
        return f"{self.kind.value}:..."


def parse_credential_ref(ref: str) -> CredentialRef:
    """Parses a reference. Variable names must be identifiers and key file paths absolute and
    printable. Raises CredentialError, whose message never quotes the input."""
    kind, sep, target = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if sep and kind in (CredentialKind.ENV, CredentialKind.ENV_KEYFILE) and _ENV_NAME.fullmatch(target):
        return CredentialRef(CredentialKind(kind), target)
    if sep and kind == CredentialKind.KEYFILE and target.startswith("/") and target.isprintable():
        return CredentialRef(CredentialKind.KEYFILE, target)
    raise CredentialError(_MALFORMED)


@dataclass(frozen=True)
class Credential:
    """A resolved secret: a password or a private key. Its repr names only the reference."""

    ref: CredentialRef
    password: str | None = field(default=None, repr=False)
    pkey: paramiko.PKey | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"Credential({self.ref.shown})"

    __str__ = __repr__

    def redactions(self) -> tuple[str, ...]:
        """What must never show up in a message, should a library ever echo it."""
        if self.password:
            return (self.password,)
        if self.pkey is not None:
            return (self.pkey.get_base64(),)
        return ()


def resolve_credential(ref: str | CredentialRef, environ: Mapping[str, str]) -> Credential:
    """Reads the secret a reference points at. Raises CredentialError naming the reference."""
    parsed = ref if isinstance(ref, CredentialRef) else parse_credential_ref(ref)
    if parsed.kind is CredentialKind.ENV:
        password = environ.get(parsed.target)
        if not password:
            raise CredentialError(f"credential {parsed} is not set")
        return Credential(parsed, password=password)
    if parsed.kind is CredentialKind.ENV_KEYFILE:
        path = environ.get(parsed.target)
        if not path:
            raise CredentialError(f"credential {parsed} is not set")
        if not os.path.isabs(path):
            raise CredentialError(f"credential {parsed} does not hold an absolute path")
    else:
        path = parsed.target
    try:
        pkey = paramiko.PKey.from_path(Path(path))
    except Exception:
        # The library's message could quote the file; ours names only the reference.
        raise CredentialError(f"credential {parsed} is not a readable unencrypted private key") from None
    return Credential(parsed, pkey=pkey)


class CredentialCache:
    """A worker process's resolved key files, so a delivery does not read and parse its destination's key
    again (about 8% of a worker's CPU under load): a key is reused while its file is the same file with
    the same size and modification time, and read again the moment it changes (a rotated key takes
    effect at the next delivery). Passwords are read from the environment each time; that costs nothing.
    Thread-safe: a race only parses a key twice."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[tuple[int, int, int, int], Credential]] = {}

    def resolve(self, ref: str | CredentialRef, environ: Mapping[str, str]) -> Credential:
        parsed = ref if isinstance(ref, CredentialRef) else parse_credential_ref(ref)
        path = _key_path(parsed, environ)
        if path is None:
            return resolve_credential(parsed, environ)
        try:
            found = os.stat(path)
        except OSError:
            raise CredentialError(f"credential {parsed} is not a readable unencrypted private key") from None
        identity = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
        cached = self._keys.get(str(parsed))
        if cached is not None and cached[0] == identity:
            return cached[1]
        credential = resolve_credential(parsed, environ)
        self._keys[str(parsed)] = (identity, credential)
        return credential


def _key_path(parsed: CredentialRef, environ: Mapping[str, str]) -> str | None:
    """The key file a reference names, if it names one that can be looked at; None for a password (or
    a reference ``resolve_credential`` will refuse, with its own words)."""
    if parsed.kind is CredentialKind.KEYFILE:
        return parsed.target
    if parsed.kind is CredentialKind.ENV_KEYFILE:
        path = environ.get(parsed.target)
        return path if path and os.path.isabs(path) else None
    return None


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-empty secret replaced by ``REDACTED``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text
