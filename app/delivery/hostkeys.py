"""Pinned SSH host keys: the one parser of a known_hosts line, the set a destination trusts, and
fetching a server's key.

A destination trusts the keys pinned for it, one when it is added and more while a partner rotates
(``exports destination host-key add``), checked on every connection (``PinnedKeys``: never
``~/.ssh/known_hosts``, never trust on first use).
The CLI and the destination parse that line here, with the same rules: one line of
``names keytype base64``, whose names (plain, or hashed with ``|1|``) include this host and port as
OpenSSH files them (``host`` on port 22, ``[host]:port`` otherwise). The line is stored normalised:
``known_hosts_name keytype base64``, without markers, other names or a comment.

Every failure is a ``HostKeyError`` with a one-line message; no paramiko exception escapes, and
operator text is shown escaped and shortened.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import socket
from typing import NamedTuple

import paramiko

from app.delivery.errors import HostKeyError

#: Longest piece of a host key line quoted back in an error, in characters.
MAX_SHOWN_CHARS = 80
_HASHED_PREFIX = "|1|"

# paramiko logs a failed handshake with a traceback from its own thread, which an operator would
# see on stderr beside our one-line HostKeyError: the fetch's transport logs where nothing listens.
_QUIET_TRANSPORT_LOG = logging.getLogger(f"{__name__}.transport")
_QUIET_TRANSPORT_LOG.addHandler(logging.NullHandler())
_QUIET_TRANSPORT_LOG.propagate = False


class PinnedHostKey(NamedTuple):
    """A parsed host key line: the normalised line to store, and the key it pins."""

    line: str
    key: paramiko.PKey


class PinnedKeys:
    """The host keys a destination trusts, in the order they were pinned; a server must present one."""

    def __init__(self, keys: tuple[paramiko.PKey, ...]) -> None:
        if not keys:
            raise HostKeyError("a destination pins at least one host key")
        self.keys = keys

    def accepts(self, key: paramiko.PKey) -> bool:
        return any(pinned.get_name() == key.get_name() and pinned.asbytes() == key.asbytes() for pinned in self.keys)

    @property
    def types(self) -> tuple[str, ...]:
        """The key types pinned, first pinned first: what the handshake should ask the server for."""
        return tuple(dict.fromkeys(key.get_name() for key in self.keys))

    def fingerprints(self) -> list[str]:
        return [fingerprint(key) for key in self.keys]


def known_hosts_name(host: str, port: int) -> str:
    """The name OpenSSH and paramiko file a server's key under."""
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_line(host: str, port: int, key: paramiko.PKey) -> str:
    """The normalised line that pins ``key`` for this host and port."""
    return f"{known_hosts_name(host, port)} {key.get_name()} {key.get_base64()}"


def fingerprint(key: paramiko.PKey) -> str:
    """The key's SHA256 fingerprint as ``ssh-keygen -l`` prints it, for an operator to compare."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


#: Parsed lines a process keeps: every delivery pins its destination's key, and an RSA key took 150 us to
#: parse each time. Keyed by the line itself, so a rotated key is a new line, parsed anew; a refused
#: line is not kept (it raises) and says why again.
PARSED_LINES = 1024


@functools.lru_cache(maxsize=PARSED_LINES)
def parse_host_key(line: str, host: str, port: int) -> PinnedHostKey:
    """Parses one known_hosts line pinned for ``host`` and ``port``; raises HostKeyError."""
    if not isinstance(line, str) or not line.strip() or not all(c.isprintable() or c == "\t" for c in line):
        raise HostKeyError("the host key must be one known_hosts line: [host]:port keytype base64")
    fields = line.split()
    if len(fields) < 3:
        raise HostKeyError("the host key must be one known_hosts line: [host]:port keytype base64")
    if fields[0].startswith("@"):
        raise HostKeyError("the host key must be one known_hosts line without a marker: "
                           "@cert-authority and @revoked pin no key")
    names, keytype, data = fields[:3]
    expected = known_hosts_name(host, port)
    # OpenSSH writes port 22 bare; "[host]:22" names the same server, so it is taken too.
    accepted = (expected, f"[{host}]:22") if port == 22 else (expected,)
    if not any(_names_host(name, wanted) for name in names.split(",") for wanted in accepted):
        raise HostKeyError(f"the host key is pinned for {_shown(names)}, not for {_shown(expected)}")
    try:
        key = paramiko.PKey.from_type_string(keytype, base64.b64decode(data, validate=True))
    except Exception:
        # paramiko raises many kinds for a damaged key; none of them helps the operator more.
        raise HostKeyError(f"the host key is not a valid {_shown(keytype)} key") from None
    return PinnedHostKey(known_hosts_line(host, port, key), key)


def fetch_host_key(host: str, port: int, timeout: float) -> paramiko.PKey:
    """The key the server at ``host:port`` presents now: trust on first use, so the caller must have
    an operator confirm its fingerprint. Waits at most ``timeout`` seconds for each step."""
    where = _shown(f"{host}:{port}")
    if not 0 < port < 65536:
        raise HostKeyError(f"cannot reach {where}: the port must be between 1 and 65535")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise HostKeyError(f"cannot reach {where}: {_shown(reason)}") from None
    transport = paramiko.Transport(sock)
    transport.set_log_channel(_QUIET_TRANSPORT_LOG.name)
    try:
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
    except Exception as exc:
        raise HostKeyError(f"{where} did not present an SSH host key: {type(exc).__name__}") from None
    finally:
        transport.close()
        sock.close()
    return key


def _names_host(name: str, expected: str) -> bool:
    if not name.startswith(_HASHED_PREFIX):
        return name == expected
    try:
        return paramiko.HostKeys.hash_host(expected, name) == name
    except (AssertionError, IndexError, ValueError, binascii.Error):
        return False  # a damaged salt names no host


def _shown(text: str) -> str:
    """Operator text made safe for a one-line message: escaped and shortened."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= MAX_SHOWN_CHARS else escaped[:MAX_SHOWN_CHARS] + "..."
