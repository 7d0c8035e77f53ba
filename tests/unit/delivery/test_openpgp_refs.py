"""Signing key references: what a well-formed one is, and that a malformed one (perhaps a key pasted in the
wrong place) is refused without being quoted. No gpg needed: a reference is parsed, not loaded."""

from __future__ import annotations

import pytest

from app.delivery.errors import DestinationError
from app.delivery.openpgp import (
    EncryptionFailed,
    KeyExpired,
    KeyRefused,
    OpenPGPError,
    PartnerKey,
    SigningRef,
    parse_signing_ref,
)
from app.errors import ExportsError

PASTED_KEY = """-----BEGIN PGP PRIVATE KEY BLOCK-----

lFgEaw9uCxYJKwYBBAHaRw8BAQdAHFsTqqoxJwIk2J9zNveP0RAwjQ0jH6Z7DxYzQ
AAD/Tm90QVJlYWxLZXlCdXRMb29rc0xpa2VPbmVGb3JUaGVUZXN0c09ubHk=
=AbCd
-----END PGP PRIVATE KEY BLOCK-----
"""


MALFORMED = ("a signing key reference must be keyfile:/absolute/path or env-keyfile:NAME "
             "(a reference to the key file, never the key)")


@pytest.mark.parametrize("value, kind, target", [
    ("keyfile:/etc/exports/signing.asc", "keyfile", "/etc/exports/signing.asc"),
    ("keyfile:/etc/exports/our signing key.gpg", "keyfile", "/etc/exports/our signing key.gpg"),
    ("env-keyfile:EXPORTS_SIGNING_KEY", "env-keyfile", "EXPORTS_SIGNING_KEY"),
    ("env-keyfile:_key2", "env-keyfile", "_key2"),
])
def test_a_well_formed_reference_parses_to_its_kind_and_target_and_prints_as_itself(
    value: str, kind: str, target: str
) -> None:
    ref = parse_signing_ref(value)

    assert ref == SigningRef(kind, target)
    assert str(ref) == value
    assert ref.shown == f"{kind}:..."


def test_a_references_repr_shows_its_kind_only() -> None:
    ref = parse_signing_ref("keyfile:/etc/exports/signing.asc")

    assert repr(ref) == "SigningRef(keyfile:...)"
    assert "/etc/exports" not in repr(ref)


@pytest.mark.parametrize("value", [
    "", ":", "keyfile:", "keyfile:relative/signing.asc", "keyfile:./signing.asc", "keyfile:~/signing.asc",
    "keyfile:/tmp/key\n/etc/passwd", "keyfile:/tmp/\x1b[31mkey", "env-keyfile:", "env-keyfile:2FAST",
    "env-keyfile:SIGNING-KEY", "env-keyfile:/etc/exports/signing.asc", "env:SIGNING_KEY", "password:hunter2",
    "KEYFILE:/etc/exports/signing.asc", " keyfile:/etc/exports/signing.asc", "/etc/exports/signing.asc",
    "keyfile:/" + "k" * 10_000, PASTED_KEY, "keyfile:" + PASTED_KEY,
], ids=lambda value: repr(value)[:40])
def test_a_malformed_reference_is_refused_in_one_line_without_quoting_it(value: str) -> None:
    with pytest.raises(KeyRefused) as refused:
        parse_signing_ref(value)

    # The same words whatever was given: nothing of the input is in them.
    assert str(refused.value) == MALFORMED


@pytest.mark.parametrize("value", [None, b"keyfile:/etc/exports/signing.asc", 42])
def test_a_reference_that_is_not_text_is_refused(value: object) -> None:
    with pytest.raises(KeyRefused) as refused:
        parse_signing_ref(value)  # type: ignore[arg-type]

    assert str(refused.value) == MALFORMED


def test_a_reference_built_directly_obeys_the_same_rules() -> None:
    with pytest.raises(KeyRefused) as refused:
        SigningRef("keyfile", "relative/secret-path")

    assert str(refused.value) == MALFORMED


def test_a_stored_partner_key_that_is_not_what_parse_public_key_returned_is_refused_without_its_values() -> None:
    stored = {"fingerprint": "not-a-fingerprint", "user_ids": [], "expires_at": None, "armored": PASTED_KEY}

    with pytest.raises(KeyRefused) as refused:
        PartnerKey.from_json(stored)

    assert "not-a-fingerprint" not in str(refused.value) and "lFgEaw9u" not in str(refused.value)


def test_the_openpgp_errors_are_destination_errors_and_the_applications_own() -> None:
    for error in (KeyRefused, KeyExpired, EncryptionFailed):
        assert issubclass(error, OpenPGPError)
    assert issubclass(OpenPGPError, DestinationError) and issubclass(DestinationError, ExportsError)
