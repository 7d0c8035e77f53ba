"""Signing secrets by reference and the Standard Webhooks signature: the spec's own test vector, what a
receiver's check refuses, a rotation's two signatures, and references that never echo a secret."""

from __future__ import annotations

import base64

import pytest

from app.webhooks import signing

#: The Standard Webhooks specification's example: secret, message id, timestamp, body and signature.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_signature_is_the_specification_s_for_its_example():
    key = signing.decode_secret(SPEC_SECRET)

    assert signing.signature(key, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_a_receiver_verifies_the_headers_it_is_sent_and_gets_the_id_to_deduplicate_on():
    secret = signing.new_secret()
    headers = signing.headers(signing.resolve("env:S", {"S": secret}), "evt-1", b"{}", timestamp=1000)

    assert signing.verify(secret, {k.title(): v for k, v in headers.items()}, b"{}", now=1100) == "evt-1"


@pytest.mark.parametrize("change, why", [
    (dict(body=b"{ }"), "no signature is the body's"),
    (dict(secret="other"), "no signature is the body's"),
    (dict(now=1000 + 301), "more than 300 s from now"),
    (dict(now=1000 - 301), "more than 300 s from now"),
    (dict(drop="webhook-signature"), "are required"),
    (dict(stamp="yesterday"), "not Unix seconds"),
])
def test_a_receiver_refuses_a_tampered_body_another_secret_a_replay_and_missing_headers(change, why):
    secret = signing.new_secret()
    headers = signing.headers((signing.decode_secret(secret),), "evt-1", b"{}", timestamp=1000)
    if "drop" in change:
        del headers[change["drop"]]
    if "stamp" in change:
        headers["webhook-timestamp"] = change["stamp"]
    other = signing.new_secret() if change.get("secret") else secret

    with pytest.raises(signing.InvalidSignature, match=why):
        signing.verify(other, headers, change.get("body", b"{}"), now=change.get("now", 1000))


def test_during_a_rotation_each_request_is_signed_by_both_secrets_and_verifies_with_either():
    old, new = signing.new_secret(), signing.new_secret()
    keys = signing.resolve("env:HOOK", {"HOOK": f"{new} {old}"})
    headers = signing.headers(keys, "evt-2", b"[]", timestamp=50)

    assert len(headers["webhook-signature"].split()) == 2
    assert signing.verify(old, headers, b"[]", now=50) == signing.verify(new, headers, b"[]", now=50) == "evt-2"


def test_a_secret_file_is_read_when_signing(tmp_path):
    secret = signing.new_secret()
    path = tmp_path / "hook.secret"
    path.write_text(secret + "\n")

    assert signing.resolve(f"file:{path}") == (signing.decode_secret(secret),)


@pytest.mark.parametrize("value, why", [
    ("plain-password-1234567890abcdef", "starts with whsec_"),
    ("whsec_" + base64.b64encode(b"short").decode(), "24 to 64 bytes, not 5"),
    ("whsec_not*base64", "rest is not"),
    ("whsec_a whsec_b whsec_c", "holds 3 secrets"),
])
def test_a_value_that_is_not_a_secret_of_the_spec_s_form_is_refused_without_being_quoted(value, why):
    with pytest.raises(signing.SecretError, match=why) as refused:
        signing.resolve("env:HOOK", {"HOOK": value})

    assert "HOOK" in str(refused.value) and value not in str(refused.value)


@pytest.mark.parametrize("ref", ["whsec_pasted_here", "env:TWO WORDS", "env:1BAD", "file:relative/path", "vault:x", ""])
def test_a_malformed_reference_is_refused_without_echoing_it(ref):
    with pytest.raises(signing.SecretError) as refused:
        signing.parse_secret_ref(ref)

    assert "env:NAME or file:/absolute/path" in str(refused.value)
    assert not ref or ref not in str(refused.value)


def test_an_unset_variable_or_a_missing_file_is_named_in_the_refusal(tmp_path):
    with pytest.raises(signing.SecretError, match="environment variable HOOK is not set"):
        signing.resolve("env:HOOK", {})
    with pytest.raises(signing.SecretError, match=f"cannot read {tmp_path}/none"):
        signing.resolve(f"file:{tmp_path}/none")
