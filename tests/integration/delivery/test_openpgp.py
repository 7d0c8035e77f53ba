"""OpenPGP against the real gpg: partner keys checked as configured, exports encrypted (and signed) in a stream
that each partner decrypts with their own gpg, and an abort that ends gpg and leaves no file.

The keys are made once for the module, each party in a GNUPGHOME of its own under the test's temporary
directory (ed25519 and cv25519: milliseconds each); the module under test never sees those homes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import tempfile
import termios
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.delivery import openpgp
from app.delivery.errors import DestinationError
from app.delivery.openpgp import (
    EncryptionFailed,
    Encryptor,
    KeyExpired,
    KeyRefused,
    PartnerKey,
    SigningRef,
    check_signing_key,
    check_usable,
    parse_public_key,
)
from exports_devtools.waiting import wait_until
from tests.fixtures.openpgp import Party, gpg, make_party, stop_agents
from tests.support import Background, unavailable

CHUNK = 256 * 1024
STREAM = 20 * 1024 * 1024
#: Where the module keeps its homes (its private directory and the throwaway ones), to find their agents.
#: Only this process's: other tests' processes (a worker signing exports) have homes of their own.
OURS = os.path.join(tempfile.gettempdir(), f"exports-openpgp-{os.getpid()}-")


@dataclass(frozen=True)
class Keys:
    alice: Party
    bob: Party
    ours: Party
    ours_file: Path
    sign_only: Party
    expired: Party
    soon: Party
    weak: Party
    revoked: str
    protected_file: Path
    expired_signer_file: Path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keys]:
    if shutil.which("gpg") is None or shutil.which("gpgconf") is None:
        unavailable("gpg (GnuPG 2.2) is not installed: .ci/install-sftp-servers installs it")
    root = tmp_path_factory.mktemp("gpg")
    ours = make_party(root, "ours", usage="sign")
    parties = {
        "alice": make_party(root, "alice"), "bob": make_party(root, "bob"), "ours": ours,
        "sign_only": make_party(root, "signonly", usage="sign"),
        "expired": make_party(root, "expired", expire="2020-06-01", when="20200101T000000!"),
        "soon": make_party(root, "soon", expire=(datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d")),
        "weak": make_party(root, "weak", algo="rsa1024"),
    }
    revoked_party = make_party(root, "revoked")
    certificate = (revoked_party.home / "openpgp-revocs.d" / f"{revoked_party.fingerprint}.rev").read_text()
    gpg(revoked_party.home, "--import", data=certificate.replace(":-----BEGIN", "-----BEGIN").encode())
    revoked = gpg(revoked_party.home, "--armor", "--export", revoked_party.fingerprint).stdout.decode()
    protected = make_party(root, "protected", usage="sign", passphrase="correct horse")
    expired_signer = make_party(root, "oldsigner", usage="sign", expire="2020-06-01", when="20200101T000000!")
    # Alice and Bob can check our signature.
    for party in (parties["alice"], parties["bob"]):
        gpg(party.home, "--import", data=ours.public.encode())
    yield Keys(**parties, ours_file=ours.export_secret(root / "ours-secret.gpg"), revoked=revoked,
               protected_file=protected.export_secret(root / "protected-secret.asc", "correct horse"),
               expired_signer_file=expired_signer.export_secret(root / "oldsigner-secret.gpg"))
    openpgp.forget_keyrings()
    stop_agents(root)


def chunks(seed: int, size: int = STREAM) -> Iterator[bytes]:
    generator = random.Random(seed)
    for _ in range(size // CHUNK):
        yield generator.randbytes(CHUNK)


def encrypt(output: Path, recipients: list[PartnerKey], data: Iterator[bytes],
            signer: SigningRef | None = None) -> str:
    """Encrypts the stream into ``output``; the plaintext's sha256."""
    digest = hashlib.sha256()
    with Encryptor(output, recipients, signer=signer) as encryptor:
        for chunk in data:
            digest.update(chunk)
            encryptor.write(chunk)
        encryptor.finish()
    return digest.hexdigest()


def decrypt(party: Party, encrypted: Path, tmp_path: Path) -> tuple[str, str]:
    """The sha256 of what ``party``'s own gpg decrypts, and gpg's status lines."""
    plain = tmp_path / f"{party.home.name}.plain"
    done = gpg(party.home, "--yes", "--output", str(plain), "--decrypt", str(encrypted))
    digest = hashlib.sha256(plain.read_bytes()).hexdigest()
    plain.unlink()
    return digest, done.stderr.decode()


def agents_of_ours() -> list[str]:
    """The live gpg-agent processes whose home is one of the module's (zombies are not alive)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"gpg-agent") and state != "Z" and OURS.encode() in b" ".join(cmdline):
            found.append(b" ".join(cmdline).decode(errors="replace"))
    return found


def gpg_children() -> list[int]:
    """The gpg processes this test process started that have not been reaped."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            name, rest = (proc / "stat").read_text().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        if name.endswith("(gpg") and int(rest.split()[1]) == os.getpid():
            found.append(int(proc.name))
    return found


def gone(pid: int) -> bool:
    """The process no longer exists (it was reaped); one that exists under that id is not our gpg."""
    try:
        name, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
    except (OSError, ValueError):
        return True
    return not name.endswith("(gpg") or int(rest.split()[1]) != os.getpid()


def assert_one_clean_line(message: str, *texts: str) -> None:
    """The message is one line and holds no line of any key text (the armored body)."""
    assert "\n" not in message
    for text in texts:
        body = [line for line in text.splitlines() if len(line) >= 16 and not line.startswith("-----")]
        assert body and not any(line in message for line in body)


# --- partner keys ------------------------------------------------------------------------------------------


def test_a_partners_public_key_parses_to_its_fingerprint_user_ids_and_expiry_and_round_trips_as_json(
    keys: Keys,
) -> None:
    key = parse_public_key(keys.alice.public)

    assert key.fingerprint == keys.alice.fingerprint
    assert key.user_ids == ("alice <alice@example.com>",)
    assert key.expires_at is None
    assert key.armored.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert key.armored not in repr(key)
    assert PartnerKey.from_json(json.loads(json.dumps(key.to_json()))) == key


def test_a_key_with_an_expiry_carries_it_and_is_refused_by_check_usable_once_it_has_passed(keys: Keys) -> None:
    key = parse_public_key(keys.soon.public)

    assert key.expires_at is not None and key.expires_at.utcoffset() == timedelta(0)
    check_usable([key], now=key.expires_at - timedelta(minutes=1))
    with pytest.raises(KeyExpired) as expired:
        check_usable([parse_public_key(keys.alice.public), key], now=key.expires_at + timedelta(days=1))

    assert keys.soon.fingerprint in str(expired.value)
    assert isinstance(expired.value, DestinationError)
    assert PartnerKey.from_json(json.loads(json.dumps(key.to_json()))).expires_at == key.expires_at


def test_a_key_that_will_have_expired_at_now_is_refused_when_configured(keys: Keys) -> None:
    key = parse_public_key(keys.soon.public)
    assert key.expires_at is not None

    with pytest.raises(KeyRefused, match="expired"):
        parse_public_key(keys.soon.public, now=key.expires_at + timedelta(seconds=1))


def _two_keys(keys: Keys) -> str:
    return keys.alice.public + "\n" + keys.bob.public


def _secret_block(keys: Keys) -> str:
    return gpg(keys.alice.home, "--armor", "--export-secret-keys", keys.alice.fingerprint).stdout.decode()


def _malformed(keys: Keys) -> str:
    lines = keys.alice.public.splitlines()
    return "\n".join(lines[:4] + lines[-2:])   # the armor without most of its body


@pytest.mark.parametrize("make, words", [
    (_malformed, "not a well-formed OpenPGP public key"),
    (lambda keys: "hello, here is our key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoq",
     "not an ASCII-armored OpenPGP public key"),
    (_secret_block, "secret"),
    (_two_keys, "holds 2 OpenPGP keys"),
    (lambda keys: keys.expired.public, "expired on 2020-06-01"),
    (lambda keys: keys.sign_only.public, "cannot encrypt"),
    (lambda keys: keys.revoked, "revoked"),
    (lambda keys: keys.weak.public, "too weak (RSA 1024 bits"),
], ids=["malformed", "not-armored", "secret-key", "two-keys", "expired", "sign-only", "revoked", "rsa-1024"])
def test_an_unusable_partner_key_is_refused_in_one_line_that_does_not_quote_it(keys: Keys, make, words: str) -> None:
    text = make(keys)

    with pytest.raises(KeyRefused) as refused:
        parse_public_key(text)

    message = str(refused.value)
    assert words in message
    if text.startswith("-----BEGIN"):
        assert_one_clean_line(message, text)
    else:
        assert "\n" not in message and "AAAAC3Nza" not in message


# --- our signing key ---------------------------------------------------------------------------------------


def test_an_unprotected_secret_key_file_is_our_signing_key_by_path_or_environment(
    keys: Keys, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EXPORTS_TEST_SIGNING_KEY", str(keys.ours_file))

    assert check_signing_key(SigningRef("keyfile", str(keys.ours_file))) == keys.ours.fingerprint
    assert check_signing_key(SigningRef("env-keyfile", "EXPORTS_TEST_SIGNING_KEY")) == keys.ours.fingerprint
    wait_until(lambda: not agents_of_ours(), "the throwaway homes' gpg-agents to end",
               diagnostics=lambda: "\n".join(agents_of_ours()))


@pytest.mark.parametrize("which, words", [
    ("protected", "protected by a passphrase"),
    ("public", "not an OpenPGP secret key"),
    ("missing", "cannot be read"),
    ("expired", "expired on 2020-06-01"),
    ("unset", "is not set"),
])
def test_a_signing_key_that_cannot_sign_unattended_is_refused_without_its_path_or_contents(
    keys: Keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str, words: str,
) -> None:
    public = tmp_path / "secret-place" / "ours-public.asc"
    public.parent.mkdir()
    public.write_text(keys.ours.public)
    path = {"protected": keys.protected_file, "public": public, "missing": tmp_path / "secret-place" / "none.gpg",
            "expired": keys.expired_signer_file, "unset": None}[which]
    if path is None:
        monkeypatch.delenv("EXPORTS_TEST_SIGNING_KEY", raising=False)
        ref = SigningRef("env-keyfile", "EXPORTS_TEST_SIGNING_KEY")
    else:
        ref = SigningRef("keyfile", str(path))

    with pytest.raises(KeyRefused) as refused:
        check_signing_key(ref)

    message = str(refused.value)
    assert words in message and "\n" not in message
    assert "secret-place" not in message and str(tmp_path) not in message
    if which == "protected":
        assert_one_clean_line(message, keys.protected_file.read_text())
    wait_until(lambda: not agents_of_ours(), "the throwaway homes' gpg-agents to end",
               diagnostics=lambda: "\n".join(agents_of_ours()))


# --- encryption ----------------------------------------------------------------------------------------------


def test_a_20_mib_stream_to_two_partners_decrypts_with_each_partners_own_key_to_exactly_the_input(
    keys: Keys, tmp_path: Path,
) -> None:
    recipients = [parse_public_key(keys.alice.public), parse_public_key(keys.bob.public)]
    encrypted = tmp_path / "export.csv.gz.gpg"

    tracemalloc.start()
    try:
        sent = encrypt(encrypted, recipients, chunks(seed=1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Memory is flat: a few chunks at most were ever held, never the stream.
    assert peak < 8 * CHUNK
    assert not encrypted.read_bytes().startswith(b"-----BEGIN")   # binary, not armored
    for party in (keys.alice, keys.bob):
        received, status = decrypt(party, encrypted, tmp_path)
        assert received == sent
        assert "DECRYPTION_OKAY" in status and "GOODMDC" in status
    packets = gpg(keys.alice.home, "--list-packets", str(encrypted)).stdout.decode()
    assert ":literal data packet:" in packets and ":compressed packet:" not in packets


def test_signed_output_verifies_against_our_public_key(keys: Keys, tmp_path: Path) -> None:
    encrypted = tmp_path / "signed.gpg"

    sent = encrypt(encrypted, [parse_public_key(keys.alice.public)], chunks(seed=2, size=2 * 1024 * 1024),
                   signer=SigningRef("keyfile", str(keys.ours_file)))

    received, status = decrypt(keys.alice, encrypted, tmp_path)
    assert received == sent
    assert f"VALIDSIG {keys.ours.fingerprint}" in status and "DECRYPTION_OKAY" in status


def test_exports_to_the_same_partners_on_several_threads_at_once_each_decrypt(keys: Keys, tmp_path: Path) -> None:
    openpgp.forget_keyrings()   # the threads race to build the one home
    recipients = [parse_public_key(keys.alice.public), parse_public_key(keys.bob.public)]
    signer = SigningRef("keyfile", str(keys.ours_file))
    runs = [Background(lambda n=n: encrypt(tmp_path / f"{n}.gpg", recipients, chunks(seed=n, size=CHUNK * 4),
                                           signer=signer if n % 2 else None)) for n in range(8)]

    sent = [run.result(timeout=60) for run in runs]

    for n, digest in enumerate(sent):
        assert decrypt(keys.bob, tmp_path / f"{n}.gpg", tmp_path)[0] == digest


def test_a_stored_key_that_is_not_the_key_its_fingerprint_names_is_refused(keys: Keys, tmp_path: Path) -> None:
    alice = parse_public_key(keys.alice.public)
    forged = PartnerKey.from_json({**alice.to_json(), "armored": parse_public_key(keys.bob.public).armored})

    with pytest.raises(KeyRefused, match=keys.alice.fingerprint):
        Encryptor(tmp_path / "forged.gpg", [forged])

    assert not (tmp_path / "forged.gpg").exists()


def test_an_expired_stored_key_is_refused_before_gpg_runs(keys: Keys, tmp_path: Path) -> None:
    alice = parse_public_key(keys.alice.public)
    expired = PartnerKey(alice.fingerprint, alice.user_ids, datetime.now(UTC) - timedelta(days=1), alice.armored)

    with pytest.raises(KeyExpired):
        Encryptor(tmp_path / "expired.gpg", [expired])

    assert not (tmp_path / "expired.gpg").exists()


def test_abort_mid_stream_kills_gpg_and_removes_the_output(keys: Keys, tmp_path: Path) -> None:
    output = tmp_path / "aborted.gpg"
    encryptor = Encryptor(output, [parse_public_key(keys.alice.public)])
    for chunk in chunks(seed=3, size=CHUNK * 4):
        encryptor.write(chunk)
    pid = encryptor.pid
    assert pid is not None and not gone(pid) and output.exists()

    encryptor.abort()

    assert encryptor._proc is not None and encryptor._proc.returncode == -signal.SIGKILL   # killed, not ended
    assert gone(pid) and gpg_children() == []
    assert not output.exists()
    encryptor.abort()   # idempotent
    with pytest.raises(EncryptionFailed):
        encryptor.write(b"more")


def test_abort_from_another_thread_ends_a_write_blocked_on_a_stalled_gpg(keys: Keys, tmp_path: Path) -> None:
    output = tmp_path / "stalled.gpg"
    encryptor = Encryptor(output, [parse_public_key(keys.alice.public)])
    pid = encryptor.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)   # gpg stops reading: the pipe fills and the write blocks
    writing = Background(lambda: encryptor.write(b"\0" * (16 * 1024 * 1024)))
    pipe = encryptor._proc.stdin.fileno()   # type: ignore[union-attr]
    capacity = fcntl.fcntl(pipe, 1032)   # F_GETPIPE_SZ

    def pipe_full() -> bool:
        pending = bytearray(4)
        fcntl.ioctl(pipe, termios.FIONREAD, pending)
        return int.from_bytes(pending, "little") >= capacity

    wait_until(pipe_full, "the write to block on gpg's full stdin pipe")
    assert not writing.done

    encryptor.abort()

    with pytest.raises(EncryptionFailed, match="aborted"):
        writing.result()
    assert gone(pid) and gpg_children() == [] and not output.exists()


def test_a_gpg_that_dies_mid_stream_fails_the_encryption_and_leaves_no_output(keys: Keys, tmp_path: Path) -> None:
    output = tmp_path / "killed.gpg"
    encryptor = Encryptor(output, [parse_public_key(keys.alice.public)])
    encryptor.write(b"x" * CHUNK)
    assert encryptor.pid is not None
    os.kill(encryptor.pid, signal.SIGKILL)

    with pytest.raises(EncryptionFailed, match="killed by signal 9"):
        for chunk in chunks(seed=4, size=CHUNK * 64):
            encryptor.write(chunk)
        encryptor.finish()

    assert not output.exists() and gpg_children() == []


def test_an_exception_in_the_with_block_aborts(keys: Keys, tmp_path: Path) -> None:
    output = tmp_path / "raised.gpg"

    with pytest.raises(RuntimeError), Encryptor(output, [parse_public_key(keys.alice.public)]) as encryptor:
        encryptor.write(b"x" * CHUNK)
        raise RuntimeError("the build failed")

    assert not output.exists() and gpg_children() == []


def test_the_module_never_touches_the_users_home_and_leaves_no_agent(
    keys: Keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GNUPGHOME", raising=False)
    openpgp.forget_keyrings()

    signer = SigningRef("keyfile", str(keys.ours_file))
    alice = parse_public_key(keys.alice.public)
    check_signing_key(signer)
    encrypt(tmp_path / "out.gpg", [alice], chunks(seed=5, size=CHUNK), signer=signer)
    openpgp.forget_keyrings()

    assert list(home.iterdir()) == []
    wait_until(lambda: not agents_of_ours(), "every gpg-agent of the module's homes to end",
               diagnostics=lambda: "\n".join(agents_of_ours()))
