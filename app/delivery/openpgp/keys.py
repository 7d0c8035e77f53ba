"""Partner keys: ``parse_public_key`` checks a partner's public key once, when it is configured, and returns
it as a ``PartnerKey`` (public: it may live in the database); ``check_usable`` tells before an export whether
it has expired since."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.delivery.errors import KeyExpired, KeyRefused
from app.delivery.openpgp.gpg import MAX_KEY_TEXT, listing_time, throwaway_home

_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
_BEGIN_PUBLIC = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
#: In a private key's armor: OpenPGP's ("PGP PRIVATE KEY BLOCK"), and OpenSSH's or PEM's pasted by mistake.
_PRIVATE = "PRIVATE KEY"
#: Algorithms whose strength is their modulus (RSA, Elgamal, DSA), and the least we accept.
_MODULUS_ALGOS = {"1": "RSA", "2": "RSA", "3": "RSA", "16": "Elgamal", "17": "DSA", "20": "Elgamal"}
_MIN_MODULUS_BITS = 2048


@dataclass(frozen=True)
class PartnerKey:
    """A partner's public key as ``parse_public_key`` accepted it. Public: it may live in the database."""

    #: The primary key's fingerprint, 40 upper-case hex digits: what encryption names the recipient by.
    fingerprint: str
    user_ids: tuple[str, ...]
    #: When the key stops being able to encrypt (tz-aware UTC): the primary key's expiry or the last of its
    #: encryption subkeys' expiries, whichever comes first. None: never.
    expires_at: datetime | None
    #: The key, ASCII-armored as gpg exported it (nothing of the text around it).
    armored: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.fingerprint, str) or not _FINGERPRINT.fullmatch(self.fingerprint):
            raise ValueError("a partner key's fingerprint is 40 upper-case hex digits")
        if self.expires_at is not None and self.expires_at.utcoffset() is None:
            raise ValueError("a partner key's expiry must be timezone-aware")

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "user_ids": list(self.user_ids),
                "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
                "armored": self.armored}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartnerKey:
        """The key ``to_json`` wrote. Raises KeyRefused (naming no field's value) if it is not that."""
        try:
            expires = d["expires_at"]
            expires_at = None if expires is None else datetime.fromisoformat(expires)
            if expires_at is not None:
                if expires_at.utcoffset() is None:
                    raise ValueError("naive expiry")
                expires_at = expires_at.astimezone(UTC)
            armored, user_ids = d["armored"], d["user_ids"]
            if not isinstance(armored, str) or _BEGIN_PUBLIC not in armored or _PRIVATE in armored:
                raise ValueError("not an armored public key")
            if not isinstance(user_ids, list) or not all(isinstance(uid, str) for uid in user_ids):
                raise ValueError("user ids")
            return cls(d["fingerprint"], tuple(user_ids), expires_at, armored)
        except (KeyError, TypeError, ValueError):
            raise KeyRefused("a stored partner key is malformed (it is not what parse_public_key returned)") from None


def parse_public_key(text: str, *, now: datetime | None = None) -> PartnerKey:
    """Checks a partner's ASCII-armored public key and returns it. Raises KeyRefused, in one line that never
    quotes the text, when it is not exactly one well-formed public key that can encrypt at ``now``: malformed,
    holding secret key material or several keys, revoked, expired, without a valid encryption (sub)key, or
    weaker than 2048 bits (RSA, DSA, Elgamal). gpg looks at it in a home of its own, removed afterwards."""
    at = _now(now)
    if not isinstance(text, str) or not text.strip():
        raise KeyRefused("the partner key is empty or not text: give the partner's ASCII-armored OpenPGP public key")
    if len(text) > MAX_KEY_TEXT:
        raise KeyRefused(f"the partner key is larger than {MAX_KEY_TEXT // 1024} KiB: give the public key only")
    if _PRIVATE in text:
        # Refused before gpg (or python-gnupg's debug log) sees it.
        raise KeyRefused("the text holds a secret (private) key: give the partner's public key only")
    if _BEGIN_PUBLIC not in text:
        raise KeyRefused(f"the text is not an ASCII-armored OpenPGP public key (no {_BEGIN_PUBLIC} line)")
    with throwaway_home(agent=False) as home:
        candidate = home.path / "candidate.asc"
        candidate.write_text(text, encoding="utf-8")
        # scan_keys reads the file (python-gnupg logs no key data for it), so nothing is imported before the
        # text is known to hold public keys only.
        scanned = home.gpg.scan_keys(str(candidate))
        if any(found.get("type") == "sec" for found in scanned):
            raise KeyRefused("the text holds secret key material: give the partner's public key only")
        if scanned.returncode != 0 or not scanned:
            raise KeyRefused("the text is not a well-formed OpenPGP public key (gpg found no key in it)")
        if len(scanned) > 1:
            raise KeyRefused(f"the text holds {len(scanned)} OpenPGP keys: give one partner key at a time")
        fingerprint = scanned[0].get("fingerprint", "")
        home.run(["--import"], candidate.read_bytes())
        listing = home.gpg.list_keys()
        listed = [found for found in listing if found.get("fingerprint") == fingerprint]
        if not listed or not _FINGERPRINT.fullmatch(fingerprint):
            raise KeyRefused("the text is not a usable OpenPGP public key (gpg would not import it)")
        expires_at = _encryption_expiry(listed[0], at)
        # A revoked user ID is not who the key is.
        user_ids = tuple(uid for uid in listed[0].get("uids", ()) if listing.uid_map.get(uid, {}).get("trust") != "r")
        armored = home.gpg.export_keys(fingerprint)
    if _BEGIN_PUBLIC not in armored:
        raise KeyRefused(f"OpenPGP key {fingerprint} could not be exported by gpg")
    return PartnerKey(fingerprint, user_ids, expires_at, armored)


def check_usable(keys: Sequence[PartnerKey], *, now: datetime | None = None) -> None:
    """Raises KeyExpired naming the first key that cannot encrypt at ``now`` any more: its primary key, or
    every one of its encryption subkeys, has expired since it was configured."""
    at = _now(now)
    for key in keys:
        if key.expires_at is not None and key.expires_at <= at:
            raise KeyExpired(f"partner key {key.fingerprint} expired on {key.expires_at.isoformat()}: "
                             "the destination needs the partner's current key")


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    return now


def _weakness(algo: str | None, length: str | None) -> str | None:
    name = _MODULUS_ALGOS.get(algo or "")
    bits = int(length) if length and length.isdigit() else 0
    if name is not None and bits < _MIN_MODULUS_BITS:
        return f"{name} {bits} bits, at least {_MIN_MODULUS_BITS} are needed"
    return None


def _encryption_expiry(key: Mapping[str, Any], at: datetime) -> datetime | None:
    """When the listed key stops being able to encrypt, checked usable at ``at`` (KeyRefused if not)."""
    fingerprint = key["fingerprint"]
    if key.get("trust") == "r":
        raise KeyRefused(f"OpenPGP key {fingerprint} is revoked")
    if key.get("trust") == "i":
        raise KeyRefused(f"OpenPGP key {fingerprint} is invalid (gpg found no valid self-signature)")
    primary_expiry = listing_time(key.get("expires"))
    if primary_expiry is not None and primary_expiry <= at:
        raise KeyRefused(f"OpenPGP key {fingerprint} expired on {primary_expiry.isoformat()}")
    if weak := _weakness(key.get("algo"), key.get("length")):
        raise KeyRefused(f"OpenPGP key {fingerprint} is too weak ({weak})")
    # (capabilities, validity, creation, expiry, algo, length) of the primary key and each subkey
    parts = [(key.get("cap", ""), "", key.get("date"), key.get("expires"), key.get("algo"), key.get("length"))]
    parts += [(sub.get("cap", ""), sub.get("trust", ""), sub.get("date"), sub.get("expires"), sub.get("algo"),
               sub.get("length")) for sub in (key.get("subkey_info") or {}).values()]
    capable = [part for part in parts if "e" in part[0]]   # lower case: the (sub)key's own capability
    if not capable:
        raise KeyRefused(f"OpenPGP key {fingerprint} cannot encrypt (it has no encryption subkey)")
    usable: list[datetime | None] = []
    for _cap, validity, created, expires, algo, length in capable:
        created_at, expiry = listing_time(created), listing_time(expires)
        if validity in ("r", "i") or (expiry is not None and expiry <= at) or (created_at and created_at > at):
            continue
        if weak := _weakness(algo, length):
            raise KeyRefused(f"OpenPGP key {fingerprint} has an encryption subkey that is too weak ({weak})")
        usable.append(expiry)
    if not usable:
        raise KeyRefused(f"OpenPGP key {fingerprint} has no encryption subkey that is valid now "
                         "(each has expired or was revoked)")
    subkeys_expiry = None if None in usable else max(expiry for expiry in usable if expiry is not None)
    candidates = [expiry for expiry in (primary_expiry, subkeys_expiry) if expiry is not None]
    return min(candidates) if candidates else None
