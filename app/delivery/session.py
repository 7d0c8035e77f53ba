"""One SSH connection to a destination and its SFTP channel, opened so that nothing can hang a worker.

``open_session`` trusts only the destination's pinned host key (never ``~/.ssh/known_hosts``, never
trust on first use: any other key raises ``HostKeyMismatch``), bounds the connect, handshake,
authentication and the opening of the SFTP subsystem by ``connect_timeout``, and every later request
by ``io_timeout`` through the channel's timeout. Its socket has TCP_NODELAY set: an SFTP exchange is a
string of small requests, each answered before the next is sent, which Nagle's algorithm and delayed
ACKs slow by tens of milliseconds each. AES-GCM is preferred when the server offers it (any cipher
paramiko knows is still accepted). The session also holds the SFTP mechanics the delivery uses:
writing a new file with pipelined writes (``upload``) and the two ways of hashing a remote file. What
paramiko's errors mean is decided here too
(``is_status_reply``).
"""

from __future__ import annotations

import functools
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.sftp import CMD_EXTENDED, CMD_EXTENDED_REPLY, CMD_STATUS, CMD_WRITE, int64

from app import logs
from app.delivery.classifier import describe, is_status_reply
from app.delivery.config import DestinationConfig
from app.delivery.credentials import Credential
from app.delivery.errors import HostKeyMismatch
from app.delivery.hostkeys import PinnedKeys, fingerprint

log = logs.get(__name__)

#: Bytes per SFTP read request (paramiko splits anything larger), and per write request to a server
#: that does not say it takes more: every server takes 32768 (the SFTP drafts' minimum).
CHUNK_SIZE = 32768
#: The largest write request sent, as OpenSSH's sftp client (its SFTP_MAX_MSG_LENGTH less 1024), to
#: a server whose limits@openssh.com reply allows it. Against 32 KiB requests it halves the SSH
#: packets paramiko builds (a 32 KiB write and its header need two) and sends an eighth of the replies.
MAX_WRITE_SIZE = 261120
#: Write requests sent ahead of their replies, as OpenSSH's sftp client (-R 64). The server's channel
#: window bounds what is really in transit; memory holds one request at a time.
WRITES_IN_FLIGHT = 64
#: Preferred, in this order, when the server offers one: AES-GCM authenticates as it encrypts, so
#: paramiko computes no HMAC per packet (its default, aes128-ctr with hmac-sha2-256, does).
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
#: Seconds between SSH keepalives on an open session, so an idle warm session is not dropped unseen.
KEEPALIVE_SECONDS = 15
#: Under a bandwidth limit, a write request carries at most this many seconds of the allowance (so the
#: upload's pace is smooth, never a burst then a long pause) ...
PACED_WRITE_SECONDS = 0.125
#: ... and the upload waits for its allowance in sleeps no longer than this, in seconds: an asynchronous
#: exception (a worker's shutdown, a time limit) is delivered between two of them, never after a long one.
PACE_SLICE_SECONDS = 0.05


@dataclass
class Session:
    """A connected SSH client and its SFTP channel; closed by ``connect`` when its block ends, or by
    whoever holds it (a warm session is kept between deliveries)."""

    client: paramiko.SSHClient
    sftp: paramiko.SFTPClient
    _write_size: int | None = field(default=None, repr=False)

    def close(self) -> None:
        for close in (self.sftp.close, self.client.close):
            try:
                close()
            except Exception:  # closing a dead connection is allowed to fail
                pass

    def upload(self, local_path: Path, remote_path: str, *, bandwidth_limit: int | None = None,
               opened: Callable[[], None] | None = None) -> tuple[int, bytes]:
        """Writes the local file to ``remote_path``, which must not exist (an exclusive create), and
        returns the size and sha256 of what was sent, once the server has acknowledged every write.
        Raises the server's refusal of a write, and a broken or silent connection's error: every wait,
        for the channel's window or for a reply, is bounded by the channel's timeout.

        ``bandwidth_limit`` (bytes per second) paces the writes; ``opened`` is called once the exclusive
        create succeeded, so a caller knows the name holds a file it wrote."""
        write_size = self.write_size()
        pace = None
        if bandwidth_limit is not None:
            pace = _Pace(bandwidth_limit)
            write_size = max(1024, min(write_size, int(bandwidth_limit * PACED_WRITE_SECONDS)))
        digest = hashlib.sha256()
        replies = _WriteReplies(self.sftp)
        offset = 0
        # paramiko's own pipelined SFTPFile.write waits for every outstanding reply whenever more than
        # 100 are out and one has arrived, which empties the pipe; and it drops the replies left at
        # close unread. Here a window of writes stays in flight and every reply is checked.
        with local_path.open("rb") as source, self.sftp.open(remote_path, "wbx") as target:
            if opened is not None:
                opened()
            while chunk := source.read(write_size):
                if pace is not None:
                    pace.wait_for(offset)
                replies.sent(self.sftp._async_request(replies, CMD_WRITE, target.handle, int64(offset), chunk))
                digest.update(chunk)
                offset += len(chunk)
                while len(replies.pending) >= WRITES_IN_FLIGHT:
                    self.sftp._read_response()
                replies.raise_refusal()
            while replies.pending:
                self.sftp._read_response()
            replies.raise_refusal()
        return offset, digest.digest()

    def write_size(self) -> int:
        """Bytes per write request: what the server's ``limits@openssh.com`` reply allows, up to
        MAX_WRITE_SIZE, else CHUNK_SIZE. Asked once per session, at its first upload."""
        if self._write_size is None:
            self._write_size = _write_size_allowed(self.sftp)
        return self._write_size

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
            log.warning("destination.remote_hash_unavailable", final_path=path, error=describe(exc))
            return None
        if kind != CMD_EXTENDED_REPLY or msg.get_text() != "sha256":
            log.warning("destination.remote_hash_unexpected_reply", final_path=path)
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


class _Pace:
    """A bandwidth limit: how long an upload waits before it may send the bytes past ``offset``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.started = time.monotonic()

    def wait_for(self, offset: int) -> None:
        while (ahead := offset / self.limit - (time.monotonic() - self.started)) > 0:
            time.sleep(min(ahead, PACE_SLICE_SECONDS))


class _WriteReplies:
    """The replies to one upload's pipelined writes, each handed here by paramiko as it is read."""

    def __init__(self, sftp: paramiko.SFTPClient) -> None:
        self.pending: set[int] = set()
        self._sftp = sftp
        self._refusal: BaseException | None = None

    def sent(self, request: int) -> None:
        self.pending.add(request)

    def _async_response(self, kind: int, msg: paramiko.Message, request: int) -> None:
        self.pending.discard(request)
        if self._refusal is not None:
            return
        if kind != CMD_STATUS:
            self._refusal = paramiko.SFTPError("expected a status reply to a write")
            return
        try:
            # The same errors paramiko raises for a refused request of any other kind.
            self._sftp._convert_status(msg)
        except (OSError, EOFError) as exc:
            self._refusal = exc

    def raise_refusal(self) -> None:
        if self._refusal is not None:
            raise self._refusal


def _write_size_allowed(sftp: paramiko.SFTPClient) -> int:
    # paramiko drops the server's extension list, so ask: OpenSSH answers with its limits (uint64
    # max-packet-length, max-read-length, max-write-length, max-open-handles); others refuse.
    try:
        kind, msg = sftp._request(CMD_EXTENDED, "limits@openssh.com")
    except OSError as exc:
        if not is_status_reply(exc):
            raise
        return CHUNK_SIZE
    if kind != CMD_EXTENDED_REPLY:
        return CHUNK_SIZE
    msg.get_int64()
    msg.get_int64()
    max_write = msg.get_int64()
    # Zero says nothing; a server that takes less than paramiko's usual 32 KiB is believed.
    return min(max_write, MAX_WRITE_SIZE) if max_write > 0 else CHUNK_SIZE


class _OnlyPinned(paramiko.MissingHostKeyPolicy):
    """Every key the server presents comes here (the client knows no host key): one of the pinned ones
    is accepted; any other is a configuration error that names what was offered, so an operator can
    check it with the partner and pin it."""

    def __init__(self, pinned: PinnedKeys) -> None:
        self.pinned = pinned

    def missing_host_key(self, client, hostname, key) -> None:
        if self.pinned.accepts(key):
            return
        # The hint before the list: an event's detail keeps the first 300 characters.
        raise HostKeyMismatch(
            f"{hostname} presented {key.get_name()} {fingerprint(key)}, not pinned; once the partner confirms it, "
            f"pin it with `exports destination host-key add` (pinned: {', '.join(self.pinned.fingerprints())})")


def open_session(config: DestinationConfig, pinned: PinnedKeys, credential: Credential) -> Session:
    """A session with the destination, authenticated with ``credential``; the caller closes it."""
    client = paramiko.SSHClient()
    # Only the pinned keys, checked by the policy: never ~/.ssh/known_hosts, never trust on first use.
    # (paramiko's own host key table holds one key per type, and a rotation may pin two of one type.)
    client.set_missing_host_key_policy(_OnlyPinned(pinned))
    try:
        sock = socket.create_connection((config.host, config.port), timeout=config.connect_timeout)
    except BaseException:
        client.close()
        raise
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
            sock=sock,
            transport_factory=functools.partial(_preferring, host_key_types=pinned.types),
        )
        sftp = _open_sftp(client, config)
    except BaseException:
        client.close()
        sock.close()
        raise
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_SECONDS)
    return Session(client, sftp)


#: The host key algorithms that present a key of a type, in the order to ask for them.
_ALGORITHMS_OF = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def _preferring(sock: socket.socket, *, host_key_types: tuple[str, ...], **kwargs) -> paramiko.Transport:
    """paramiko's transport with PREFERRED_CIPHERS first, and the pinned key types first among host key
    algorithms: the client's order decides, so a server that offers AES-GCM gets it (any other still
    gets a cipher it shares with paramiko), and one with several host keys presents a pinned one."""
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    preferred = tuple(name for name in PREFERRED_CIPHERS if name in options.ciphers)
    options.ciphers = preferred + tuple(name for name in options.ciphers if name not in preferred)
    # An RSA key signs with SHA-2 where the server allows it (OpenSSH refuses ssh-rsa's SHA-1), as paramiko
    # itself asks for a known RSA host key.
    wanted = [name for key_type in host_key_types for name in _ALGORITHMS_OF.get(key_type, (key_type,))]
    pinned = tuple(dict.fromkeys(name for name in wanted if name in options.key_types))
    options.key_types = pinned + tuple(name for name in options.key_types if name not in pinned)
    return transport


@contextmanager
def connect(config: DestinationConfig, pinned: PinnedKeys, credential: Credential) -> Iterator[Session]:
    """A session with the destination, authenticated with ``credential``, closed when the block ends."""
    session = open_session(config, pinned, credential)
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
