"""Our signing key, held by reference (``SigningRef``): a key file's path, or the environment variable that
holds that path, never the key. ``check_signing_key`` loads it once to prove it signs unattended; the
keyrings load it the same way (``load_signing_key``) into the home that signs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from app.delivery.errors import KeyRefused
from app.delivery.openpgp.gpg import MAX_KEY_TEXT, Home, listing_time, status_detail, throwaway_home

KEYFILE = "keyfile"
ENV_KEYFILE = "env-keyfile"
_MALFORMED_SIGNER = ("a signing key reference must be keyfile:/absolute/path or env-keyfile:NAME "
                     "(a reference to the key file, never the key)")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: gpg-agent error codes (the low 16 bits of a FAILURE status) that mean a passphrase was wanted.
_PASSPHRASE_WANTED = {11, 85, 99, 177}   # BAD_PASSPHRASE, NO_PIN_ENTRY, CANCELED, NO_PASSPHRASE


@dataclass(frozen=True)
class SigningRef:
    """A reference to our signing key, never the key: ``keyfile:/path`` (an unprotected secret key file,
    armored or binary) or ``env-keyfile:NAME`` (environment variable NAME holds that path). Its repr and
    messages show its kind only."""

    kind: str
    target: str

    def __post_init__(self) -> None:
        if not _well_formed(self.kind, self.target):
            raise KeyRefused(_MALFORMED_SIGNER)

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"

    def __repr__(self) -> str:
        return f"SigningRef({self.shown})"

    @property
    def shown(self) -> str:
        """The reference as messages show it: its kind only (the target is a path or names one)."""
        return f"{self.kind}:..."


def _well_formed(kind: object, target: object) -> bool:
    if not isinstance(kind, str) or not isinstance(target, str):
        return False
    if kind == ENV_KEYFILE:
        return _ENV_NAME.fullmatch(target) is not None
    return kind == KEYFILE and target.startswith("/") and target.isprintable() and len(target) <= 4096


def parse_signing_ref(value: str) -> SigningRef:
    """Parses a signing key reference. Raises KeyRefused, whose message never quotes the input (it may be a
    key pasted in the wrong place)."""
    kind, sep, target = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not _well_formed(kind, target):
        raise KeyRefused(_MALFORMED_SIGNER)
    return SigningRef(kind, target)


def check_signing_key(ref: SigningRef) -> str:
    """Loads the signing key now and returns its fingerprint. Raises KeyRefused (naming the reference's kind
    only) when the file is missing or unreadable, or holds no single secret key that can sign unattended:
    none, several, expired, revoked, without a signing capability, or protected by a passphrase."""
    data = read_signing_key(ref, signing_key_path(ref))
    with throwaway_home(agent=True) as home:
        return load_signing_key(home, ref, data)


def signing_key_path(ref: SigningRef) -> str:
    """The key file's path the reference names (KeyRefused if its variable is unset or not absolute)."""
    if ref.kind == KEYFILE:
        return ref.target
    path = os.environ.get(ref.target)
    if not path:
        raise KeyRefused(f"signing key {ref.shown} is not set")
    if not os.path.isabs(path):
        raise KeyRefused(f"signing key {ref.shown} does not hold an absolute path")
    return path


def read_signing_key(ref: SigningRef, path: str) -> bytes:
    """The key file's bytes (KeyRefused, naming the reference's kind only, if unreadable, empty or too large)."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_KEY_TEXT + 1)
    except OSError:
        # OSError's message names the path; ours names the reference's kind only.
        raise KeyRefused(f"signing key {ref.shown} cannot be read") from None
    if not data or len(data) > MAX_KEY_TEXT:
        raise KeyRefused(f"signing key {ref.shown} is not an OpenPGP secret key file")
    return data


def load_signing_key(home: Home, ref: SigningRef, data: bytes) -> str:
    """Imports the secret key into ``home`` (through our own pipe: python-gnupg's import_keys would log it)
    and proves it signs unattended with a test signature. Returns its fingerprint."""
    home.run(["--import"], data)
    secret = home.gpg.list_keys(secret=True)
    if not secret:
        raise KeyRefused(f"signing key {ref.shown} is not an OpenPGP secret key")
    if len(secret) > 1:
        raise KeyRefused(f"signing key {ref.shown} holds {len(secret)} secret keys: give one")
    key = secret[0]
    fingerprint = str(key.get("fingerprint", ""))
    public = [found for found in home.gpg.list_keys() if found.get("fingerprint") == fingerprint]
    listed = public[0] if public else key
    if listed.get("trust") == "r":
        raise KeyRefused(f"signing key {ref.shown} ({fingerprint}) is revoked")
    expiry = listing_time(listed.get("expires"))
    if expiry is not None and expiry <= datetime.now(UTC):
        raise KeyRefused(f"signing key {ref.shown} ({fingerprint}) expired on {expiry.isoformat()}")
    caps = [listed.get("cap", "")] + [sub.get("cap", "") for sub in (listed.get("subkey_info") or {}).values()]
    if not any("s" in cap for cap in caps):
        raise KeyRefused(f"signing key {ref.shown} ({fingerprint}) cannot sign")
    returncode, statuses = home.run(["--sign", "--local-user", fingerprint, "--output", "-"], b"exports check")
    if returncode == 0 and any(word == "SIG_CREATED" for word, _ in statuses):
        return fingerprint
    wanted = any(word in ("NEED_PASSPHRASE", "BAD_PASSPHRASE", "MISSING_PASSPHRASE") for word, _ in statuses) or any(
        word == "FAILURE" and _code(value) in _PASSPHRASE_WANTED for word, value in statuses)
    if wanted:
        raise KeyRefused(f"signing key {ref.shown} ({fingerprint}) is protected by a passphrase: "
                         "an unattended signer needs an unprotected key")
    raise KeyRefused(f"signing key {ref.shown} ({fingerprint}) cannot sign: {status_detail(statuses)}")


def _code(value: str) -> int:
    last = value.split()[-1] if value.split() else ""
    return int(last) & 0xFFFF if last.isdigit() else -1
