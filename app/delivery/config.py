"""One partner destination as configured: where it is, the key it must present, where its credential
is, and what the partner's contract lets a delivery rely on.

A ``DestinationConfig`` is validated when it is built, with the same parsers the CLI uses
(``app.delivery.credentials``, ``app.delivery.hostkeys``), so a row that cannot describe a delivery
is refused by the policy before a job is claimed, not found out half way through an upload. It holds
no secret, only a reference to one, resolved when connecting.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from app.delivery.credentials import CredentialRef, parse_credential_ref
from app.delivery.errors import InvalidDestination
from app.delivery.hostkeys import PinnedKeys, known_hosts_name, parse_host_key
from app.delivery.modes import DeliveryMode

#: Seconds allowed for the TCP connect, SSH handshake, authentication and opening the SFTP session.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds a single SFTP request may wait for its reply before the delivery gives up on it.
DEFAULT_IO_TIMEOUT = 30.0
#: Seconds to wait for the partner's acknowledgment file after the rename.
DEFAULT_ACK_WAIT = 5.0
#: Sessions a partner allows at once unless its destination says otherwise (the schema's default).
DEFAULT_MAX_SESSIONS = 4
#: The lowest bandwidth limit a destination may set, in bytes per second (the schema's CHECK).
MIN_BANDWIDTH_LIMIT = 1024

_CAPABILITIES = ("remote_hash", "acknowledgments", "name_and_size_identify", "read_back")


@dataclass(frozen=True)
class DestinationConfig:
    """One partner destination and the partner's contract. Holds no secret, only a reference to one."""

    host: str
    port: int
    username: str
    remote_dir: str
    #: One known_hosts line, ``[host]:port keytype base64`` (``host keytype base64`` on port 22).
    host_key: str
    #: ``env:NAME``, ``keyfile:/path`` or ``env-keyfile:NAME``: where the secret is, never the secret.
    credential_ref: str
    #: The server computes sha256 through the ``check-file-name`` extension (ProFTPD mod_sftp).
    remote_hash: bool = False
    #: The partner writes ``<final>.ack`` with the sha256 hex of the file it accepted.
    acknowledgments: bool = False
    #: The contract says name and size identify a file, so they may identify the original's delivery.
    name_and_size_identify: bool = False
    #: We may download the final file to hash it.
    read_back: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    io_timeout: float = DEFAULT_IO_TIMEOUT
    ack_wait: float = DEFAULT_ACK_WAIT
    #: Sessions the partner allows at once, over every worker host.
    max_sessions: int = DEFAULT_MAX_SESSIONS
    #: Further known_hosts lines the server may present instead (a partner rotating its key).
    more_host_keys: tuple[str, ...] = ()
    #: How a delivery publishes a file on this server (``app.delivery.modes``).
    delivery_mode: DeliveryMode = DeliveryMode.STANDARD
    #: The partner's limit on our uploads, in bytes per second; None: as fast as the link allows.
    bandwidth_limit: int | None = None

    def __post_init__(self) -> None:
        parse_credential_ref(self.credential_ref)
        if not 0 < self.port < 65536:
            raise InvalidDestination("port must be between 1 and 65535")
        if not self.remote_dir:
            raise InvalidDestination("remote_dir must not be empty")
        for name in ("connect_timeout", "io_timeout"):
            if not getattr(self, name) > 0:
                raise InvalidDestination(f"{name} must be positive: an unbounded wait can hang a worker")
        if self.ack_wait < 0:
            raise InvalidDestination("ack_wait must not be negative")
        if not 1 <= self.max_sessions <= 64:
            raise InvalidDestination("max_sessions must be between 1 and 64")
        if not isinstance(self.delivery_mode, DeliveryMode):
            raise InvalidDestination(f"delivery_mode must be a DeliveryMode, not {self.delivery_mode!r}")
        if self.bandwidth_limit is not None and self.bandwidth_limit < MIN_BANDWIDTH_LIMIT:
            raise InvalidDestination(f"bandwidth_limit must be at least {MIN_BANDWIDTH_LIMIT} bytes per second")
        self.pinned_keys()

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> DestinationConfig:
        """The config a ``destinations`` row describes (``app.store.directory.read_destination``).
        Raises a DestinationError when the row cannot describe a delivery."""
        return cls(host=row["host"], port=row["port"], username=row["username"],  # type: ignore[arg-type]
                   remote_dir=row["remote_dir"], host_key=row["host_key"],  # type: ignore[arg-type]
                   credential_ref=row["credential_ref"], remote_hash=row["remote_hash"],  # type: ignore[arg-type]
                   acknowledgments=row["acknowledgments"],  # type: ignore[arg-type]
                   name_and_size_identify=row["name_and_size_identify"],  # type: ignore[arg-type]
                   read_back=row["read_back"],  # type: ignore[arg-type]
                   max_sessions=row["max_sessions"],  # type: ignore[arg-type]
                   more_host_keys=tuple(row.get("more_host_keys") or ()),  # type: ignore[arg-type]
                   delivery_mode=_mode(row.get("delivery_mode")),
                   bandwidth_limit=row.get("bandwidth_limit"))  # type: ignore[arg-type]

    def __repr__(self) -> str:
        # The reference is not a secret, but a repr travels into logs and tracebacks: show its kind only.
        capabilities = [name for name in _CAPABILITIES if getattr(self, name)]
        return (
            f"DestinationConfig(host={self.host!r}, port={self.port}, username={self.username!r}, "
            f"remote_dir={self.remote_dir!r}, credential={self.credential.shown}, "
            f"capabilities={capabilities}, mode={self.delivery_mode.value})"
        )

    __str__ = __repr__

    @property
    def credential(self) -> CredentialRef:
        """The parsed credential reference."""
        return parse_credential_ref(self.credential_ref)

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko file this server's key under."""
        return known_hosts_name(self.host, self.port)

    def pinned_keys(self) -> PinnedKeys:
        """The host keys this server may present."""
        return PinnedKeys(tuple(parse_host_key(line, self.host, self.port).key
                                for line in (self.host_key, *self.more_host_keys)))

    def remote_path(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            # A bug, not a configuration: every name here is the product's own, made from a delivery key.
            raise ValueError("a file name must be a single path component")
        return posixpath.join(self.remote_dir, name)


def _mode(value: object) -> DeliveryMode:
    try:
        return DeliveryMode.of(value)  # type: ignore[arg-type]
    except ValueError:
        # Written by a later release, or by hand: not a mode this one knows how to deliver in.
        raise InvalidDestination(f"unknown delivery mode {value!r}") from None
