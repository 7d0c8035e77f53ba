"""Credential references: one set of rules for the CLI and the destination config, and resolution
to the secret that never shows in a repr, a message or an exception."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.delivery.config import DestinationConfig
from app.delivery.credentials import (
    Credential,
    CredentialCache,
    CredentialKind,
    CredentialRef,
    parse_credential_ref,
    redact,
    resolve_credential,
)
from app.delivery.errors import CredentialError, DestinationError
from app.errors import ExportsError

PASSWORD = "hunter2-but-longer"
HOST_KEY = "[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def private_key_file(path: Path) -> tuple[Path, list[str]]:
    """An unencrypted OpenSSH private key file, and its body lines (the secret)."""
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    path.write_bytes(pem)
    return path, [line for line in pem.decode().splitlines() if not line.startswith("-----")]


@pytest.mark.parametrize("ref, kind, target", [
    ("env:PARTNER_PW", CredentialKind.ENV, "PARTNER_PW"),
    ("env:_pw2", CredentialKind.ENV, "_pw2"),
    ("keyfile:/etc/exports/partner key", CredentialKind.KEYFILE, "/etc/exports/partner key"),
    ("env-keyfile:PARTNER_KEY", CredentialKind.ENV_KEYFILE, "PARTNER_KEY"),
])
def test_a_well_formed_reference_parses_to_its_kind_and_target_and_prints_as_itself(
    ref: str, kind: CredentialKind, target: str
) -> None:
    parsed = parse_credential_ref(ref)

    assert parsed == CredentialRef(kind, target)
    assert str(parsed) == ref
    assert parsed.shown == f"{kind.value}:..."


@pytest.mark.parametrize("ref", [
    "hunter2", "", ":", "env:", "env:2FAST", "env:PARTNER-PW", "env:PW\n", "env:PW extra", "env:$PW",
    "env-keyfile:", "env-keyfile:./key", "keyfile:", "keyfile:relative/key", "keyfile:~/.ssh/id_ed25519",
    "keyfile:/tmp/key\n/etc/passwd", "keyfile:/tmp/\x1b[31mkey", "password:hunter2", "ENV:PW", " env:PW",
    "env:PÄRTNER", "keyfile:/" + "k" * 10_000 + "\x00",
], ids=lambda ref: repr(ref)[:40])
def test_a_malformed_reference_is_refused_without_quoting_it(ref: str) -> None:
    with pytest.raises(CredentialError) as refused:
        parse_credential_ref(ref)

    message = str(refused.value)
    assert message.startswith("a credential reference must be env:NAME, keyfile:/absolute/path or env-keyfile:NAME")
    assert "\n" not in message
    assert all(part not in message for part in ("hunter2", "PARTNER-PW", "relative", "2FAST"))


def test_credential_errors_are_destination_errors_and_the_applications_own() -> None:
    assert issubclass(CredentialError, DestinationError) and issubclass(DestinationError, ExportsError)


def test_an_env_reference_resolves_to_the_password_and_shows_only_its_kind() -> None:
    credential = resolve_credential("env:PARTNER_PW", {"PARTNER_PW": PASSWORD})

    assert credential.password == PASSWORD and credential.pkey is None
    assert credential.redactions() == (PASSWORD,)
    assert PASSWORD not in repr(credential) and PASSWORD not in str(credential)
    assert repr(credential) == "Credential(env:...)"


@pytest.mark.parametrize("environ", [{}, {"PARTNER_PW": ""}], ids=["unset", "empty"])
def test_an_env_reference_to_an_unset_variable_names_the_reference(environ: dict[str, str]) -> None:
    with pytest.raises(CredentialError, match="^credential env:PARTNER_PW is not set$"):
        resolve_credential("env:PARTNER_PW", environ)


def test_a_keyfile_reference_resolves_to_the_private_key(tmp_path: Path) -> None:
    path, body = private_key_file(tmp_path / "partner_key")

    credential = resolve_credential(f"keyfile:{path}", {})

    assert credential.pkey is not None and credential.password is None
    assert credential.redactions() == (credential.pkey.get_base64(),)
    assert not any(line in repr(credential) for line in body)


def test_an_env_keyfile_reference_reads_the_path_from_the_environment(tmp_path: Path) -> None:
    path, _ = private_key_file(tmp_path / "partner_key")

    credential = resolve_credential(parse_credential_ref("env-keyfile:PARTNER_KEY"), {"PARTNER_KEY": str(path)})

    assert isinstance(credential, Credential) and credential.pkey is not None


def test_an_env_keyfile_reference_to_a_relative_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="^credential env-keyfile:PARTNER_KEY does not hold an absolute path$"):
        resolve_credential("env-keyfile:PARTNER_KEY", {"PARTNER_KEY": "keys/partner"})


def test_a_key_file_that_does_not_parse_is_refused_without_quoting_it(tmp_path: Path) -> None:
    _, body = private_key_file(tmp_path / "real_key")
    garbled = tmp_path / "garbled_key"
    garbled.write_text("\n".join(("-----BEGIN OPENSSH PRIVATE KEY-----", *body[:-1], "-----END")) + "\n")

    for path in (garbled, tmp_path / "missing_key", tmp_path):
        with pytest.raises(CredentialError) as refused:
            resolve_credential(f"keyfile:{path}", {})
        assert str(refused.value) == f"credential keyfile:{path} is not a readable unencrypted private key"
        assert refused.value.__cause__ is None and refused.value.__suppress_context__
        assert not any(line in str(refused.value) for line in body)


def test_redact_replaces_every_secret_and_ignores_empty_ones() -> None:
    assert redact(f"{PASSWORD} and {PASSWORD} or key", [PASSWORD, "", "key"]) == "*** and *** or ***"
    assert redact("nothing to hide", []) == "nothing to hide"


def test_the_destination_config_refuses_a_reference_the_cli_would_refuse() -> None:
    for ref in ("hunter2", "keyfile:relative/key", "env:PARTNER-PW"):
        with pytest.raises(CredentialError) as refused:
            DestinationConfig(host="127.0.0.1", port=2222, username="p", remote_dir="/inbox", host_key=HOST_KEY,
                              credential_ref=ref)
        assert ref not in str(refused.value)


def test_the_destination_configs_repr_shows_the_references_kind_only() -> None:
    config = DestinationConfig(host="127.0.0.1", port=2222, username="p", remote_dir="/inbox", host_key=HOST_KEY,
                               credential_ref="keyfile:/etc/exports/partner_key", read_back=True)

    assert repr(config) == ("DestinationConfig(host='127.0.0.1', port=2222, username='p', remote_dir='/inbox', "
                            "credential=keyfile:..., capabilities=['read_back'], mode=standard)")
    assert config.credential == CredentialRef(CredentialKind.KEYFILE, "/etc/exports/partner_key")


def test_the_cache_parses_a_key_file_once_while_the_file_is_unchanged(tmp_path):
    path, _ = private_key_file(tmp_path / "id_ed25519")
    cache = CredentialCache()

    first = cache.resolve(f"keyfile:{path}", {})
    second = cache.resolve(f"keyfile:{path}", {})

    assert second is first and first.pkey is not None


def test_a_rotated_key_file_is_read_again_at_the_next_resolution(tmp_path):
    path, _ = private_key_file(tmp_path / "id_ed25519")
    cache = CredentialCache()
    before = cache.resolve("env-keyfile:KEY", {"KEY": str(path)})

    private_key_file(tmp_path / "rotated")
    (tmp_path / "rotated").replace(path)   # a new file under the same name, as a rotation leaves it
    after = cache.resolve("env-keyfile:KEY", {"KEY": str(path)})

    assert after is not before and after.pkey.get_base64() != before.pkey.get_base64()


def test_a_cached_key_whose_file_is_gone_is_refused_naming_only_the_reference(tmp_path):
    path, body = private_key_file(tmp_path / "id_ed25519")
    cache = CredentialCache()
    cache.resolve(f"keyfile:{path}", {})
    path.unlink()

    with pytest.raises(CredentialError) as refused:
        cache.resolve(f"keyfile:{path}", {})

    assert str(path) in str(refused.value) and not any(line in str(refused.value) for line in body)


def test_the_cache_reads_a_password_from_the_environment_every_time():
    cache = CredentialCache()

    assert cache.resolve("env:PW", {"PW": "one-password"}).password == "one-password"
    assert cache.resolve("env:PW", {"PW": "another-password"}).password == "another-password"
