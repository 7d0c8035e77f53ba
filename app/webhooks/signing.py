"""Signing secrets by reference, and the Standard Webhooks signature (https://www.standardwebhooks.com/).

An endpoint's row holds a *reference* to its secret (``env:NAME`` or ``file:/absolute/path``), never the
secret, which is read here, when a request is signed, from the notifier's environment or file system: a
rotated secret takes effect at the next request, with no restart. The secret is the spec's
``whsec_<base64>`` (24 to 64 random bytes); during a rotation the variable or file may hold two,
separated by a space, and each request then carries a signature by each.

A request carries three headers: ``webhook-id`` (the event's id, the same on every retry, which the
receiver deduplicates on), ``webhook-timestamp`` (when it was sent, Unix seconds) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256>`` of ``<id>.<timestamp>.<body>`` by each secret, space
separated). ``verify`` is the receiver's side, with the spec's replay window of five minutes.

No secret is ever in a message: a reference that cannot be resolved is named by its kind and target (a
variable name, a path), and a malformed reference is never echoed back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.errors import ExportsError

#: The spec's prefix of a serialized secret.
SECRET_PREFIX = "whsec_"
#: The spec's bounds on a secret's random bytes.
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
#: Seconds a receiver accepts between webhook-timestamp and its own clock, either way (the spec's five minutes).
TOLERANCE_SECONDS = 300
#: Secrets a reference may hold at once: the current one, and during a rotation the next.
MAX_SECRETS = 2
#: The longest secret file read.
_MAX_FILE_BYTES = 4096
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MALFORMED = ("a signing secret reference must be env:NAME or file:/absolute/path "
              "(a reference to the secret, never the secret)")


class SecretError(ExportsError):
    """Raised when a signing secret reference is malformed, cannot be read, or does not hold a secret of
    the spec's form. The message names the reference's target, never the secret."""


class InvalidSignature(ExportsError):
    """Raised when a webhook request's headers are missing, its timestamp is outside the replay window, or
    no signature in it is the body's by the secret (``verify``: a receiver's check)."""


@dataclass(frozen=True)
class SecretRef:
    #: ``env`` or ``file``.
    kind: str
    #: An environment variable name, or an absolute path.
    target: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"


def parse_secret_ref(ref: str) -> SecretRef:
    """A well-formed reference, or SecretError (which never quotes the input: it may be a secret pasted
    in the wrong place)."""
    kind, sep, target = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if sep and kind == "env" and _ENV_NAME.fullmatch(target):
        return SecretRef(kind, target)
    if sep and kind == "file" and target.startswith("/") and target.isprintable() and len(target) <= 1024:
        return SecretRef(kind, target)
    raise SecretError(_MALFORMED)


def new_secret() -> str:
    """A fresh secret in the spec's form (32 random bytes)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def decode_secret(secret: str) -> bytes:
    """The HMAC key a serialized secret holds. Raises SecretError, without the secret, when it is not
    ``whsec_`` and the base64 of 24 to 64 bytes."""
    if not secret.startswith(SECRET_PREFIX):
        raise SecretError(f"a signing secret starts with {SECRET_PREFIX} (then the base64 of "
                          f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} random bytes)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(f"a signing secret is {SECRET_PREFIX} then base64, and this one's rest is not") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise SecretError(f"a signing secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, "
                          f"not {len(key)}")
    return key


def resolve(ref: str | SecretRef, env: Mapping[str, str] | None = None) -> tuple[bytes, ...]:
    """The keys the reference holds now (one, or two during a rotation), read from ``env`` (the
    process's environment) or the file. Raises SecretError saying which variable or file, never what it
    held."""
    parsed = ref if isinstance(ref, SecretRef) else parse_secret_ref(ref)
    if parsed.kind == "env":
        value = (os.environ if env is None else env).get(parsed.target)
        if not value:
            raise SecretError(f"environment variable {parsed.target} is not set in this process")
    else:
        try:
            with Path(parsed.target).open("rb") as f:
                raw = f.read(_MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise SecretError(f"cannot read {parsed.target}: {exc.strerror or type(exc).__name__}") from None
        if len(raw) > _MAX_FILE_BYTES:
            raise SecretError(f"{parsed.target} is longer than a signing secret")
        try:
            value = raw.decode("ascii")
        except UnicodeDecodeError:
            raise SecretError(f"{parsed.target} does not hold a signing secret") from None
    parts = value.split()
    if not 1 <= len(parts) <= MAX_SECRETS:
        raise SecretError(f"{parsed} holds {len(parts)} secrets; one, or two while rotating")
    try:
        return tuple(decode_secret(part) for part in parts)
    except SecretError as exc:
        raise SecretError(f"{parsed}: {exc}") from None


def signature(key: bytes, event_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64>``: HMAC-SHA256 by ``key`` of ``<event_id>.<timestamp>.<body>``."""
    signed = f"{event_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def headers(keys: tuple[bytes, ...], event_id: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """The request's headers: its id, when it is sent, and a signature by each key."""
    sent = int(time.time()) if timestamp is None else timestamp
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(sent),
        "webhook-signature": " ".join(signature(key, event_id, sent, body) for key in keys),
    }


def verify(secret: str, request_headers: Mapping[str, str], body: bytes, *, now: float | None = None,
           tolerance_seconds: int = TOLERANCE_SECONDS) -> str:
    """The receiver's check: the headers are there, the timestamp is within the replay window, and one
    of the signatures is the body's by ``secret`` (``whsec_...``). Returns the event id, to deduplicate
    on; raises InvalidSignature saying which check failed. Header names are matched in any case."""
    lowered = {k.lower(): v for k, v in request_headers.items()}
    event_id, stamp, signatures = (lowered.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not event_id or not stamp or not signatures:
        raise InvalidSignature("webhook-id, webhook-timestamp and webhook-signature are required")
    try:
        sent = int(stamp)
    except ValueError:
        raise InvalidSignature("webhook-timestamp is not Unix seconds") from None
    if abs((time.time() if now is None else now) - sent) > tolerance_seconds:
        raise InvalidSignature(f"webhook-timestamp is more than {tolerance_seconds} s from now: a replay, "
                               "or a clock that is off")
    expected = signature(decode_secret(secret), event_id, sent, body)
    if not any(hmac.compare_digest(expected, given) for given in signatures.split()):
        raise InvalidSignature("no signature is the body's by this secret")
    return event_id
