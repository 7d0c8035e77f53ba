"""One SSH connection to a destination and its SFTP channel, opened so that nothing can hang a worker.

``connect`` trusts only the destination's pinned host key (paramiko's ``RejectPolicy``, never
``~/.ssh/known_hosts``), bounds the connect, handshake, authentication and the opening of the SFTP
subsystem by ``connect_timeout``, and every later request by ``io_timeout`` through the channel's
timeout. The session also holds the two ways of hashing a remote file, which are SFTP requests
rather than delivery decisions. What paramiko's errors mean is decided here too (``is_status_reply``).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import paramiko
from paramiko.sftp import CMD_EXTENDED, CMD_EXTENDED_REPLY, int64

from app.delivery.classifier import describe
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential

log = logging.getLogger(__name__)

#: Bytes per SFTP read or write request; paramiko splits anything larger anyway.
CHUNK_SIZE = 32768


def is_status_reply(exc: BaseException) -> bool:
    """True for the error paramiko raises when the server answered a request with a failure status.

    paramiko turns a status into a plain OSError (errno None), FileNotFoundError or PermissionError;
    a broken or silent connection raises TimeoutError, ConnectionError, EOFError or SSHException,
    which say nothing about what the server did.
    """
    return (
        isinstance(exc, OSError)
        and not isinstance(exc, (TimeoutError, ConnectionError))
        and exc.errno in (None, errno.ENOENT, errno.EACCES)
    )


@dataclass
class Session:
    """A connected SSH client and its SFTP channel; closed by ``connect`` when its block ends."""

    client: paramiko.SSHClient
    sftp: paramiko.SFTPClient

    def close(self) -> None:
        for close in (self.sftp.close, self.client.close):
            try:
                close()
            except Exception:  # closing a dead connection is allowed to fail
                pass

    def remote_sha256(self, path: str) -> bytes | None:
        """The server's sha256 of ``path`` through ``check-file-name``; None when the server does not
        offer it or answers oddly. Raises FileNotFoundError, and a broken connection's error."""
        # ProFTPD's check-file-name: path, algorithms, offset, length (0 = to the end), block size
        # (0 = one hash). paramiko's SFTPFile.check sends the older "check-file" that ProFTPD rejects.
        try:
            kind, msg = self.sftp._request(
                CMD_EXTENDED, "check-file-name", path, "sha256", int64(0), int64(0), 0
            )
        except FileNotFoundError:
            raise
        except OSError as exc:
            if not is_status_reply(exc):
                raise
            # Unsupported or refused: the contract promised a hash, so say so, but a missing hash
            # only weakens the evidence.
            log.warning("destination.remote_hash_unavailable final_path=%s error=%s", path, describe(exc))
            return None
        if kind != CMD_EXTENDED_REPLY or msg.get_text() != "sha256":
            log.warning("destination.remote_hash_unexpected_reply final_path=%s", path)
            return None
        digest = msg.get_remainder()
        return digest if len(digest) == 32 else None

    def read_back_sha256(self, path: str) -> bytes:
        """The sha256 of ``path`` computed here, by downloading it."""
        digest = hashlib.sha256()
        with self.sftp.open(path, "rb") as remote:
            remote.prefetch()
            while chunk := remote.read(CHUNK_SIZE):
                digest.update(chunk)
        return digest.digest()


@contextmanager
def connect(config: DestinationConfig, pinned: paramiko.PKey, credential: Credential) -> Iterator[Session]:
    """A session with the destination, authenticated with ``credential``, closed when the block ends."""
    client = paramiko.SSHClient()
    # Only the pinned key: never ~/.ssh/known_hosts, never trust on first use.
    client.get_host_keys().add(config.known_hosts_name, pinned.get_name(), pinned)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            config.host,
            port=config.port,
            username=config.username,
            password=credential.password,
            pkey=credential.pkey,
            timeout=config.connect_timeout,
            banner_timeout=config.connect_timeout,
            auth_timeout=config.connect_timeout,
            channel_timeout=config.connect_timeout,
            look_for_keys=False,
            allow_agent=False,
        )
        sftp = _open_sftp(client, config)
    except BaseException:
        client.close()
        raise
    session = Session(client, sftp)
    try:
        yield session
    finally:
        session.close()


def _open_sftp(client: paramiko.SSHClient, config: DestinationConfig) -> paramiko.SFTPClient:
    transport = client.get_transport()
    assert transport is not None
    # paramiko waits for the subsystem reply without a timeout; a watchdog closes the transport
    # if the server never answers, which wakes the wait with an exception.
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        transport.close()

    watchdog = threading.Timer(config.connect_timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        channel = transport.open_session(timeout=config.connect_timeout)
        channel.settimeout(config.io_timeout)
        channel.invoke_subsystem("sftp")
        sftp = paramiko.SFTPClient(channel)
    except Exception:
        if fired.is_set():
            raise TimeoutError("the server did not open an SFTP session in time") from None
        raise
    finally:
        watchdog.cancel()
    # Every later request waits at most io_timeout for its reply: a hung server cannot block us.
    sftp.get_channel().settimeout(config.io_timeout)
    return sftp
