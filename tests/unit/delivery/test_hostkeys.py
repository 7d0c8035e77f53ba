"""Pinned host keys: one parser for the CLI and the destination config, which accepts one known_hosts
line naming this host and port, stores it normalised, and refuses anything else with one clean line."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
import threading

import paramiko
import pytest

from app.delivery import session
from app.delivery.config import DestinationConfig
from app.delivery.errors import DestinationError, HostKeyError, HostKeyMismatch
from app.delivery.hostkeys import (
    PinnedKeys,
    fetch_host_key,
    fingerprint,
    known_hosts_line,
    known_hosts_name,
    parse_host_key,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
LINE = f"[127.0.0.1]:2222 {KEY}"


def test_known_hosts_names_bracket_the_host_only_off_port_22() -> None:
    assert known_hosts_name("sftp.partner.example", 22) == "sftp.partner.example"
    assert known_hosts_name("127.0.0.1", 2222) == "[127.0.0.1]:2222"


def test_a_normalised_line_for_this_host_and_port_is_stored_unchanged() -> None:
    pinned = parse_host_key(LINE, "127.0.0.1", 2222)

    assert pinned.line == LINE
    assert f"{pinned.key.get_name()} {pinned.key.get_base64()}" == KEY
    line, key = pinned  # the CLI unpacks it
    assert (line, key) == (pinned.line, pinned.key)


def test_a_line_on_port_22_names_the_bare_host() -> None:
    assert parse_host_key(f"sftp.partner.example {KEY}", "sftp.partner.example", 22).line == \
        f"sftp.partner.example {KEY}"


@pytest.mark.parametrize("line", [
    f"other.example,[127.0.0.1]:2222,10.0.0.1 {KEY}",
    f"[127.0.0.1]:2222\t{KEY.replace(' ', chr(9))}",
    f"  [127.0.0.1]:2222 {KEY} root@partner comment  ",
], ids=["several-names", "tabs", "comment-and-spaces"])
def test_a_line_is_normalised_to_this_hosts_name_the_key_type_and_the_key(line: str) -> None:
    assert parse_host_key(line, "127.0.0.1", 2222).line == LINE


def test_a_hashed_name_is_accepted_when_it_hashes_this_host_and_port() -> None:
    hashed = paramiko.HostKeys.hash_host("[127.0.0.1]:2222")

    assert parse_host_key(f"{hashed} {KEY}", "127.0.0.1", 2222).line == LINE
    with pytest.raises(HostKeyError, match="is pinned for"):
        parse_host_key(f"{hashed} {KEY}", "127.0.0.1", 2223)


def test_port_22_may_be_pinned_bare_as_openssh_writes_it_or_bracketed_and_is_kept_bare() -> None:
    bare = parse_host_key(f"127.0.0.1 {KEY}", "127.0.0.1", 22)

    assert parse_host_key(f"[127.0.0.1]:22 {KEY}", "127.0.0.1", 22) == bare
    assert bare.line.startswith("127.0.0.1 ")


@pytest.mark.parametrize("line, port", [
    (f"[127.0.0.1]:22 {KEY}", 2222),
    (f"127.0.0.1 {KEY}", 2222),
    (f"[127.0.0.1]:2222 {KEY}", 22),
    (f"[127.0.0.1]:22222 {KEY}", 2222),
    (f"[127.0.0.2]:2222 {KEY}", 2222),
    (f"*.0.0.1 {KEY}", 22),
    (f"|1|AAAA|BBBB {KEY}", 2222),
], ids=["port-22-line-for-2222", "bare-host-for-2222", "bracketed-for-22", "longer-port", "other-host",
        "a-pattern", "a-damaged-hash"])
def test_a_line_pinned_for_another_host_or_port_is_refused(line: str, port: int) -> None:
    with pytest.raises(HostKeyError) as refused:
        parse_host_key(line, "127.0.0.1", port)

    assert str(refused.value).startswith("the host key is pinned for ")
    assert str(refused.value).endswith(f"not for {known_hosts_name('127.0.0.1', port)}")


@pytest.mark.parametrize("line", [
    "", "   ", KEY, "[127.0.0.1]:2222", "[127.0.0.1]:2222 ssh-ed25519",
    f"@cert-authority [127.0.0.1]:2222 {KEY}", f"@revoked [127.0.0.1]:2222 {KEY}",
], ids=["empty", "blank", "no-host", "no-key", "no-key-data", "cert-authority", "revoked"])
def test_something_that_is_not_one_known_hosts_line_is_refused(line: str) -> None:
    with pytest.raises(HostKeyError, match="^the host key must be one known_hosts line"):
        parse_host_key(line, "127.0.0.1", 2222)


@pytest.mark.parametrize("line", [
    "[127.0.0.1]:2222 ssh-ed25519 AAAA",
    "[127.0.0.1]:2222 ssh-ed25519 not*base64",
    "[127.0.0.1]:2222 ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x07ssh-rsa\x00").decode(),
    "[127.0.0.1]:2222 ssh-rsa " + KEY.split()[1],
    "[127.0.0.1]:2222 ssh-unknown " + KEY.split()[1],
    "[127.0.0.1]:2222 ecdsa-sha2-nistp256 " + base64.b64encode(b"\xff" * 64).decode(),
], ids=["truncated", "not-base64", "damaged-blob", "wrong-type", "unknown-type", "garbage-ecdsa"])
def test_key_data_that_is_not_a_valid_key_of_its_type_is_refused_without_a_library_error(line: str) -> None:
    with pytest.raises(HostKeyError, match="^the host key is not a valid ") as refused:
        parse_host_key(line, "127.0.0.1", 2222)

    assert refused.value.__cause__ is None and refused.value.__suppress_context__


@pytest.mark.parametrize("line", [
    f"{LINE}\n[evil.example]:22 {KEY}",
    f"{LINE}\r",
    f"{LINE}\x00",
    f"[127.0.0.1]:2222\x1b[2J {KEY}",
    None,
    b"[127.0.0.1]:2222 " + KEY.encode(),
], ids=["two-lines", "carriage-return", "nul", "terminal-escape", "none", "bytes"])
def test_a_hostile_value_is_refused_as_not_one_line(line: object) -> None:
    with pytest.raises(HostKeyError, match="^the host key must be one known_hosts line"):
        parse_host_key(line, "127.0.0.1", 2222)  # type: ignore[arg-type]


@pytest.mark.parametrize("names", ["\u202eevil.example", "é" * 5_000, "x" * 10_000])
def test_a_hostile_name_is_shown_escaped_on_one_short_line(names: str) -> None:
    with pytest.raises(HostKeyError) as refused:
        parse_host_key(f"{names} {KEY}", "127.0.0.1", 2222)

    message = str(refused.value)
    assert message.isascii() and message.isprintable()
    assert len(message) < 200


def test_host_key_errors_are_destination_errors() -> None:
    assert issubclass(HostKeyError, DestinationError)


def test_a_fingerprint_is_the_unpadded_base64_sha256_of_the_key_as_ssh_keygen_prints_it() -> None:
    key = parse_host_key(LINE, "127.0.0.1", 2222).key
    digest = hashlib.sha256(base64.b64decode(KEY.split()[1])).digest()

    assert fingerprint(key) == "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    assert known_hosts_line("127.0.0.1", 2222, key) == LINE


def test_the_destination_config_refuses_a_line_the_cli_would_refuse_and_pins_the_key_it_accepts() -> None:
    fields = dict(host="127.0.0.1", username="p", remote_dir="/inbox", credential_ref="env:PW")

    with pytest.raises(HostKeyError):
        DestinationConfig(port=2222, host_key=f"[127.0.0.1]:22 {KEY}", **fields)  # type: ignore[arg-type]
    config = DestinationConfig(port=2222, host_key=LINE, **fields)  # type: ignore[arg-type]

    assert config.known_hosts_name == "[127.0.0.1]:2222"
    assert [k.get_base64() for k in config.pinned_keys().keys] == [KEY.split()[1]]


# -- fetching ------------------------------------------------------------------------------------------


def test_fetching_from_a_closed_port_says_it_cannot_reach_the_server() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on a port just released by a socket that never listened.
    with pytest.raises(HostKeyError, match=f"^cannot reach 127.0.0.1:{port}: "):
        fetch_host_key("127.0.0.1", port, timeout=2.0)


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_fetching_from_an_impossible_port_is_refused(port: int) -> None:
    with pytest.raises(HostKeyError, match="the port must be between 1 and 65535"):
        fetch_host_key("127.0.0.1", port, timeout=2.0)


def test_fetching_from_a_server_that_speaks_no_ssh_says_it_presented_no_key_and_prints_no_traceback() -> None:
    # paramiko logs the failed handshake from its own thread; an operator must see our line only. In a
    # fresh interpreter, as the CLI runs it: pytest hooks every logger, so caplog cannot tell.
    script = ("import sys\nfrom app.delivery.hostkeys import fetch_host_key\n"
              "try:\n    fetch_host_key('127.0.0.1', int(sys.argv[1]), 5.0)\n"
              "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_nonsense() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"220 not an ssh server\r\n")

        answering = threading.Thread(target=answer_nonsense, daemon=True)
        answering.start()
        fetched = subprocess.run([sys.executable, "-c", script, str(port)], capture_output=True, text=True,
                                 timeout=30, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        answering.join(timeout=5)

    assert fetched.stdout == f"HostKeyError 127.0.0.1:{port} did not present an SSH host key: SSHException\n"
    assert fetched.stderr == ""


# -- several pinned keys (a partner rotating its key) ----------------------------------------------------


def test_pinned_keys_accept_any_key_pinned_and_no_other_and_ask_for_their_types_first_pinned_first() -> None:
    old, new, stranger = (paramiko.RSAKey.generate(1024) for _ in range(3))
    ed = paramiko.PKey.from_type_string(KEY.split()[0], base64.b64decode(KEY.split()[1]))
    pinned = PinnedKeys((old, ed, new))

    assert pinned.accepts(new) and pinned.accepts(ed) and not pinned.accepts(stranger)
    assert pinned.types == ("ssh-rsa", KEY.split()[0])
    assert pinned.fingerprints() == [fingerprint(old), fingerprint(ed), fingerprint(new)]
    with pytest.raises(HostKeyError, match="at least one"):
        PinnedKeys(())


def test_a_key_not_pinned_is_refused_naming_the_fingerprint_offered_and_how_to_pin_it() -> None:
    pinned, offered = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    policy = session._OnlyPinned(PinnedKeys((pinned,)))

    policy.missing_host_key(None, "[127.0.0.1]:2222", pinned)   # accepted: no exception
    with pytest.raises(HostKeyMismatch) as refused:
        policy.missing_host_key(None, "[127.0.0.1]:2222", offered)

    message = str(refused.value)
    assert f"presented ssh-rsa {fingerprint(offered)}, not pinned" in message
    assert "exports destination host-key add" in message and message.endswith(f"(pinned: {fingerprint(pinned)})")


def test_the_destination_config_pins_its_host_key_and_every_further_one() -> None:
    other = paramiko.RSAKey.generate(1024)
    config = DestinationConfig(host="127.0.0.1", port=2222, username="p", remote_dir="/inbox", credential_ref="env:PW",
                               host_key=LINE, more_host_keys=(f"[127.0.0.1]:2222 ssh-rsa {other.get_base64()}",))

    assert config.pinned_keys().accepts(other) and len(config.pinned_keys().keys) == 2
    with pytest.raises(HostKeyError):
        DestinationConfig(host="127.0.0.1", port=2222, username="p", remote_dir="/inbox", credential_ref="env:PW",
                          host_key=LINE, more_host_keys=(f"[127.0.0.1]:22 ssh-rsa {other.get_base64()}",))


def test_a_pinned_line_is_parsed_once_per_process_and_a_rotated_line_anew(monkeypatch) -> None:
    parse_host_key.cache_clear()
    parsed, real = [], paramiko.PKey.from_type_string

    def counted(keytype, data):
        parsed.append(keytype)
        return real(keytype, data)

    def config(line: str) -> DestinationConfig:   # as each delivery builds it from the job's row
        return DestinationConfig(host="127.0.0.1", port=2222, username="p", remote_dir="/inbox",
                                 credential_ref="env:PW", host_key=line)

    monkeypatch.setattr(paramiko.PKey, "from_type_string", counted)
    first = config(LINE).pinned_keys()
    assert config(LINE).pinned_keys().keys == first.keys and parsed == ["ssh-ed25519"]

    rotated = paramiko.RSAKey.generate(1024)
    now = config(f"[127.0.0.1]:2222 ssh-rsa {rotated.get_base64()}").pinned_keys()
    assert now.accepts(rotated) and not first.accepts(rotated)
    assert parsed == ["ssh-ed25519", "ssh-rsa"]
