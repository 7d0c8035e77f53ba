"""The partner destination: an SFTP server reached with paramiko.

Delivery follows the reference's rules for an upload that is safe to interrupt:

- The final name is listed first and the listing is handed to ``record_evidence`` as the baseline
  before a single byte is uploaded, so recovery and reconciliation see what the worker saw.
- An occupied final name is never overwritten by default. An original stops with
  FinalNameOccupied; a replacement stops with OriginalDelivered when the file there is identified as
  the original's delivery, FinalNameOccupied when it cannot be identified, and overwrites only with
  the partner's recorded agreement.
- The file is written under a temporary name in the remote directory,
  ``.<final>.<attempt_id>.part``: a leading dot and a ``.part`` suffix, which the partner agrees to
  ignore, and the attempt id so two attempts never share one. Only a complete, verified upload is
  renamed to the final name.
- The rename is SSH_FXP_RENAME, which on OpenSSH and ProFTPD refuses an existing target, so a file
  that lands between the listing and the rename is never replaced. ``posix-rename@openssh.com``,
  which replaces, is used only for a replacement with an overwrite agreement that found a file.
- Completed needs evidence read back after the rename: name and size changed from an absent
  baseline (the partner publishes by atomic rename), stronger with a checksum (``check-file-name``
  sha256, or a read-back where the contract allows) or the partner's acknowledgment file. An
  overwrite needs the stronger evidence. Anything that stops the delivery part way goes through the
  classifier, which answers Failed only on proof that the final name was never written.

No secret is ever held by the config, logged, or put in an exception or outcome: the config holds a
*reference* to the credential, resolved only when connecting.
"""

from __future__ import annotations

import base64
import binascii
import enum
import errno
import hashlib
import json
import logging
import os
import posixpath
import stat as stat_module
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import paramiko
from paramiko.sftp import CMD_EXTENDED, CMD_EXTENDED_REPLY, int64

from app.delivery.classifier import (
    Completed,
    DeliveryOutcome,
    Failed,
    FailureCode,
    Stage,
    Unknown,
    classify,
    describe,
)
from app.store.types import ExpectedFile  # the expected file is the store's: what cutoff 2 records

__all__ = [
    "Completed",
    "CredentialError",
    "DeliveryOutcome",
    "Destination",
    "DestinationConfig",
    "DestinationError",
    "Evidence",
    "EvidenceStage",
    "ExpectedFile",
    "Failed",
    "FailureCode",
    "HostKeyError",
    "Listing",
    "Proof",
    "Receipt",
    "Unknown",
    "ack_name",
    "temp_name",
]

log = logging.getLogger(__name__)

#: Seconds allowed for the TCP connect, SSH handshake, authentication and opening the SFTP session.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds a single SFTP request may wait for its reply before the delivery gives up on it.
DEFAULT_IO_TIMEOUT = 30.0
#: Seconds to wait for the partner's acknowledgment file after the rename.
DEFAULT_ACK_WAIT = 5.0
#: Seconds between two reads of the acknowledgment file while waiting for it.
ACK_POLL_INTERVAL = 0.05
#: Bytes per SFTP write request; paramiko splits anything larger anyway.
CHUNK_SIZE = 32768
#: The partner writes ``<final>.ack`` holding the sha256 hex of the file it accepted.
ACK_SUFFIX = ".ack"
#: An acknowledgment file larger than this is not an acknowledgment, in bytes.
MAX_ACK_BYTES = 1024


class DestinationError(Exception):
    """Base class of the destination's own errors."""


class CredentialError(DestinationError):
    """Raised when a credential reference cannot be resolved. Names the reference, never the secret."""


class HostKeyError(DestinationError):
    """Raised when the pinned host key line cannot be parsed or names another host."""


class UploadMismatch(DestinationError):
    """Raised when what was uploaded under the temporary name is not the expected file."""


class CredentialKind(enum.StrEnum):
    """How ``credential_ref`` points at the secret."""

    #: ``env:NAME``: the password is in environment variable NAME.
    ENV = "env"
    #: ``keyfile:/path``: an unencrypted private key file.
    KEYFILE = "keyfile"
    #: ``env-keyfile:NAME``: environment variable NAME holds the path of a private key file.
    ENV_KEYFILE = "env-keyfile"


def _parse_credential_ref(ref: str) -> tuple[CredentialKind, str]:
    kind, sep, target = ref.partition(":")
    try:
        parsed = CredentialKind(kind)
    except ValueError:
        parsed = None
    if not sep or parsed is None or not target:
        raise CredentialError(
            "credential_ref must be env:NAME, keyfile:/path or env-keyfile:NAME"
        )
    return parsed, target


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

    def __post_init__(self) -> None:
        _parse_credential_ref(self.credential_ref)
        if not 0 < self.port < 65536:
            raise ValueError("port must be between 1 and 65535")
        if not self.remote_dir:
            raise ValueError("remote_dir must not be empty")
        for name in ("connect_timeout", "io_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive: an unbounded wait can hang a worker")
        if self.ack_wait < 0:
            raise ValueError("ack_wait must not be negative")
        _pinned_key(self)

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> DestinationConfig:
        """The config a ``destinations`` row describes (``app.store.directory.read_destination``).
        Raises ValueError or DestinationError when the row cannot describe a delivery."""
        return cls(host=row["host"], port=row["port"], username=row["username"],  # type: ignore[arg-type]
                   remote_dir=row["remote_dir"], host_key=row["host_key"],  # type: ignore[arg-type]
                   credential_ref=row["credential_ref"], remote_hash=row["remote_hash"],  # type: ignore[arg-type]
                   acknowledgments=row["acknowledgments"],  # type: ignore[arg-type]
                   name_and_size_identify=row["name_and_size_identify"],  # type: ignore[arg-type]
                   read_back=row["read_back"])  # type: ignore[arg-type]

    def __repr__(self) -> str:
        # The reference is not a secret, but a repr travels into logs and tracebacks: show its kind only.
        kind, _ = _parse_credential_ref(self.credential_ref)
        capabilities = [
            name
            for name in ("remote_hash", "acknowledgments", "name_and_size_identify", "read_back")
            if getattr(self, name)
        ]
        return (
            f"DestinationConfig(host={self.host!r}, port={self.port}, username={self.username!r}, "
            f"remote_dir={self.remote_dir!r}, credential={kind.value}:..., "
            f"capabilities={capabilities})"
        )

    __str__ = __repr__

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko file this server's key under."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def remote_path(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError("a file name must be a single path component")
        return posixpath.join(self.remote_dir, name)


def temp_name(final_name: str, attempt_id: str) -> str:
    """The temporary name an attempt uploads under; the partner ignores dot-files ending in .part."""
    return f".{final_name}.{attempt_id}.part"


def ack_name(final_name: str) -> str:
    """The partner's acknowledgment file for a final name."""
    return final_name + ACK_SUFFIX


class Proof(enum.Enum):
    """How a listing ties the file under a final name to an expected file, weakest first."""

    NONE = "none"
    #: Name and size fit and nothing contradicts them: weak, different exports can share a size.
    NAME_AND_SIZE = "name-and-size"
    #: A sha256 of the remote file (server-side or read back) equals the expected one.
    CHECKSUM = "checksum"
    #: The partner's acknowledgment names the expected sha256.
    ACKNOWLEDGMENT = "acknowledgment"

    @property
    def strong(self) -> bool:
        """Evidence an overwrite, or an identification without a name-and-size contract, can use."""
        return self in (Proof.CHECKSUM, Proof.ACKNOWLEDGMENT)


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Listing:
    """What the destination showed for one final name at one moment."""

    final_name: str
    present: bool
    size: int | None = None
    #: Modification time in whole seconds, as SFTP v3 reports it; used only to notice a change.
    mtime: int | None = None
    sha256: bytes | None = field(default=None, repr=False)
    #: Where the hash came from: "check-file-name" or "read-back".
    hash_source: str | None = None
    #: The acknowledgment file's content (lower-case sha256 hex), if the partner wrote one.
    ack: str | None = None
    observed_at: datetime = field(default_factory=_now, compare=False)

    @property
    def occupied(self) -> bool:
        """Something was published under this name: the file, or the partner's acknowledgment of one."""
        return self.present or self.ack is not None

    def same_as(self, other: Listing) -> bool:
        """True when nothing observable changed between two listings of the same name."""
        if self.present != other.present or self.ack != other.ack:
            return False
        if not self.present:
            return True
        if self.size != other.size or self.mtime != other.mtime:
            return False
        return self.sha256 is None or other.sha256 is None or self.sha256 == other.sha256

    def checksum_matches(self, expected: ExpectedFile) -> bool:
        return self.present and self.sha256 is not None and self.sha256 == expected.sha256

    def ack_matches(self, expected: ExpectedFile) -> bool:
        return self.ack is not None and self.ack == expected.sha256_hex

    def contradicts(self, expected: ExpectedFile) -> bool:
        """The file under the name is provably not the expected one (its size or hash differ)."""
        if not self.present:
            return False
        if self.size != expected.size:
            return True
        return self.sha256 is not None and self.sha256 != expected.sha256

    def proof_for(self, expected: ExpectedFile) -> Proof:
        """The strongest tie between this listing and an expected file.

        An acknowledgment outlives the file (a partner may move a processed file away), so it counts
        even when the file is absent. A differing acknowledgment is not a contradiction on its own:
        it may be a stale one for an earlier file.
        """
        if self.contradicts(expected):
            return Proof.NONE
        if self.checksum_matches(expected):
            return Proof.CHECKSUM
        if self.ack_matches(expected):
            return Proof.ACKNOWLEDGMENT
        if self.present and self.ack is None:
            return Proof.NAME_AND_SIZE
        return Proof.NONE

    def matches(self, expected: ExpectedFile) -> bool:
        """Name and size at least, and nothing contradicts: the weakest acceptable tie."""
        return self.proof_for(expected) is not Proof.NONE

    def as_dict(self) -> dict[str, object]:
        return {
            "final_name": self.final_name,
            "present": self.present,
            "size": self.size,
            "mtime": self.mtime,
            "sha256": self.sha256.hex() if self.sha256 is not None else None,
            "hash_source": self.hash_source,
            "ack": self.ack,
            "observed_at": self.observed_at.isoformat(),
        }


class EvidenceStage(enum.StrEnum):
    """When a listing was taken during a delivery."""

    BASELINE = "baseline"
    RECEIPT = "receipt"
    RENAME_REFUSED = "rename-refused"
    INTERRUPTED = "interrupted"
    INSPECTED = "inspected"


@dataclass(frozen=True)
class Evidence:
    """One observation of the destination, for the caller to append to the attempt's evidence."""

    stage: EvidenceStage
    listing: Listing
    attempt_id: str | None = None

    def to_detail(self) -> str:
        """Compact JSON for a text column; holds no secret (a listing never does)."""
        payload: dict[str, object] = {"stage": self.stage.value, "attempt_id": self.attempt_id}
        payload.update(self.listing.as_dict())
        return json.dumps(payload, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Receipt:
    """What the destination confirmed after the rename: the evidence behind Completed."""

    final_name: str
    size: int
    proof: Proof
    overwrote: bool
    evidence: Evidence

    def to_detail(self) -> str:
        payload = json.loads(self.evidence.to_detail())
        payload.update({"proof": self.proof.value, "overwrote": self.overwrote})
        return json.dumps(payload, separators=(",", ":"), sort_keys=True)


RecordEvidence = Callable[[Evidence], None]


def _is_status_reply(exc: BaseException) -> bool:
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


@dataclass(frozen=True)
class _Credential:
    password: str | None = field(default=None, repr=False)
    pkey: paramiko.PKey | None = field(default=None, repr=False)

    def redactions(self) -> tuple[str, ...]:
        # What must never show up in a message, should a library ever echo it.
        if self.password:
            return (self.password,)
        if self.pkey is not None:
            return (self.pkey.get_base64(),)
        return ()


def _resolve_credential(ref: str, environ: Mapping[str, str]) -> _Credential:
    kind, target = _parse_credential_ref(ref)
    if kind is CredentialKind.ENV:
        password = environ.get(target)
        if not password:
            raise CredentialError(f"credential env:{target} is not set")
        return _Credential(password=password)
    if kind is CredentialKind.ENV_KEYFILE:
        path = environ.get(target)
        if not path:
            raise CredentialError(f"credential env-keyfile:{target} is not set")
    else:
        path = target
    try:
        pkey = paramiko.PKey.from_path(Path(path))
    except (OSError, paramiko.SSHException, ValueError, TypeError, binascii.Error):
        # The library's message could quote the file; ours names only the reference.
        raise CredentialError(f"credential {kind.value}:{target} is not a readable unencrypted private key") from None
    return _Credential(pkey=pkey)


def _pinned_key(config: DestinationConfig) -> paramiko.PKey:
    fields = config.host_key.split()
    if len(fields) == 2:
        hosts, keytype, data = None, fields[0], fields[1]
    elif len(fields) >= 3 and not fields[0].startswith("@"):
        hosts, keytype, data = fields[0], fields[1], fields[2]
    else:
        raise HostKeyError("host_key must be one known_hosts line: [host]:port keytype base64")
    if hosts is not None and not hosts.startswith("|"):
        names = hosts.split(",")
        if config.known_hosts_name not in names:
            raise HostKeyError(f"host_key is pinned for {hosts}, not for {config.known_hosts_name}")
    try:
        return paramiko.PKey.from_type_string(keytype, base64.b64decode(data))
    except (paramiko.SSHException, ValueError, binascii.Error) as exc:
        raise HostKeyError(f"host_key is not a valid {keytype} key") from exc


@dataclass
class _Session:
    client: paramiko.SSHClient
    sftp: paramiko.SFTPClient

    def close(self) -> None:
        for close in (self.sftp.close, self.client.close):
            try:
                close()
            except Exception:  # closing a dead connection is allowed to fail
                pass


class Destination:
    """A partner's SFTP destination. Thread-safe: each call opens and closes its own connection."""

    def __init__(self, config: DestinationConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._environ = environ if environ is not None else os.environ
        self._pinned = _pinned_key(config)

    def __repr__(self) -> str:
        return f"Destination({self.config!r})"

    # -- connection -----------------------------------------------------------------------------

    @contextmanager
    def _connect(self, credential: _Credential) -> Iterator[_Session]:
        cfg = self.config
        client = paramiko.SSHClient()
        # Only the pinned key: never ~/.ssh/known_hosts, never trust on first use.
        client.get_host_keys().add(cfg.known_hosts_name, self._pinned.get_name(), self._pinned)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                cfg.host,
                port=cfg.port,
                username=cfg.username,
                password=credential.password,
                pkey=credential.pkey,
                timeout=cfg.connect_timeout,
                banner_timeout=cfg.connect_timeout,
                auth_timeout=cfg.connect_timeout,
                channel_timeout=cfg.connect_timeout,
                look_for_keys=False,
                allow_agent=False,
            )
            sftp = self._open_sftp(client)
        except BaseException:
            client.close()
            raise
        session = _Session(client, sftp)
        try:
            yield session
        finally:
            session.close()

    def _open_sftp(self, client: paramiko.SSHClient) -> paramiko.SFTPClient:
        transport = client.get_transport()
        assert transport is not None
        # paramiko waits for the subsystem reply without a timeout; a watchdog closes the transport
        # if the server never answers, which wakes the wait with an exception.
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            transport.close()

        watchdog = threading.Timer(self.config.connect_timeout, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            channel = transport.open_session(timeout=self.config.connect_timeout)
            channel.settimeout(self.config.io_timeout)
            channel.invoke_subsystem("sftp")
            sftp = paramiko.SFTPClient(channel)
        except Exception:
            if fired.is_set():
                raise TimeoutError("the server did not open an SFTP session in time") from None
            raise
        finally:
            watchdog.cancel()
        # Every later request waits at most io_timeout for its reply: a hung server cannot block us.
        sftp.get_channel().settimeout(self.config.io_timeout)
        return sftp

    def _credential(self) -> _Credential:
        return _resolve_credential(self.config.credential_ref, self._environ)

    # -- observation ----------------------------------------------------------------------------

    def inspect(self, final_name: str, *, with_hash: bool = True) -> Listing:
        """What the destination shows now under a final name (for recovery and reconciliation).

        Raises the connection's error if the destination cannot be reached; callers treat that as
        "no evidence", never as absence.
        """
        with self._connect(self._credential()) as session:
            return self._list(session, final_name, with_hash=with_hash)

    def _list(self, session: _Session, final_name: str, *, with_hash: bool) -> Listing:
        path = self.config.remote_path(final_name)
        ack = self._read_ack(session, final_name) if self.config.acknowledgments else None
        try:
            attrs = session.sftp.stat(path)
        except FileNotFoundError:
            return Listing(final_name=final_name, present=False, ack=ack)
        if attrs.st_mode is not None and not stat_module.S_ISREG(attrs.st_mode):
            # A directory or special file still occupies the name; it just cannot be a delivery.
            return Listing(final_name=final_name, present=True, size=None, mtime=attrs.st_mtime, ack=ack)
        digest, source = (None, None)
        if with_hash:
            digest, source = self._hash(session, path)
        return Listing(
            final_name=final_name,
            present=True,
            size=attrs.st_size,
            mtime=attrs.st_mtime,
            sha256=digest,
            hash_source=source,
            ack=ack,
        )

    def _hash(self, session: _Session, path: str) -> tuple[bytes | None, str | None]:
        if self.config.remote_hash:
            digest = self._remote_sha256(session, path)
            if digest is not None:
                return digest, "check-file-name"
        if self.config.read_back:
            return self._read_back_sha256(session, path), "read-back"
        return None, None

    def _remote_sha256(self, session: _Session, path: str) -> bytes | None:
        # ProFTPD's check-file-name: path, algorithms, offset, length (0 = to the end), block size
        # (0 = one hash). paramiko's SFTPFile.check sends the older "check-file" that ProFTPD rejects.
        try:
            kind, msg = session.sftp._request(
                CMD_EXTENDED, "check-file-name", path, "sha256", int64(0), int64(0), 0
            )
        except FileNotFoundError:
            raise
        except OSError as exc:
            if not _is_status_reply(exc):
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

    def _read_back_sha256(self, session: _Session, path: str) -> bytes:
        digest = hashlib.sha256()
        with session.sftp.open(path, "rb") as remote:
            remote.prefetch()
            while chunk := remote.read(CHUNK_SIZE):
                digest.update(chunk)
        return digest.digest()

    def _read_ack(self, session: _Session, final_name: str) -> str | None:
        path = self.config.remote_path(ack_name(final_name))
        try:
            with session.sftp.open(path, "rb") as remote:
                raw = remote.read(MAX_ACK_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(raw) > MAX_ACK_BYTES:
            return "<oversized>"
        return raw.decode("ascii", errors="replace").strip().lower()

    # -- delivery -------------------------------------------------------------------------------

    def deliver(
        self,
        local_path: Path | str,
        expected: ExpectedFile,
        *,
        attempt_id: str,
        replacement: bool = False,
        replacement_of: ExpectedFile | None = None,
        overwrite_agreed: bool = False,
        record_evidence: RecordEvidence,
    ) -> DeliveryOutcome:
        """Deliver ``local_path`` under ``expected.name``; never raises for an ordinary error.

        ``replacement`` says the job replaces an original, whose expected file (``replacement_of``) is
        known only if the original reached cutoff 2. ``record_evidence`` is called with the baseline
        before any upload (if it raises, nothing is
        uploaded), and with every later observation (receipt, refused rename, interruption).
        A BaseException (shutdown, time limit) propagates unchanged; the caller classifies it with
        ``classify(exc, stage=Stage.UNKNOWN)``, which is always OutcomeUnknown.
        """
        final = expected.name
        temp = temp_name(final, attempt_id)
        # Programming errors, raised before anything is sent rather than classified.
        self.config.remote_path(final)
        self.config.remote_path(temp)
        stage = Stage.CONNECT
        baseline: Listing | None = None
        credential: _Credential | None = None
        fields = f"attempt_id={attempt_id} final_name={final}"
        try:
            credential = self._credential()
            with self._connect(credential) as session:
                stage = Stage.BASELINE
                baseline = self._list(session, final, with_hash=True)
                # Recorded before anything is uploaded: if it cannot be recorded, nothing is.
                record_evidence(Evidence(EvidenceStage.BASELINE, baseline, attempt_id))
                log.info(
                    "delivery.baseline %s present=%s size=%s", fields, baseline.present, baseline.size
                )
                decision = self._decide(baseline, replacement or replacement_of is not None, replacement_of,
                                        overwrite_agreed)
                if isinstance(decision, Failed):
                    log.info("delivery.refused %s code=%s", fields, decision.code.value)
                    return decision
                overwrite = decision
                stage = Stage.UPLOAD
                self._upload(session, Path(local_path), temp, expected)
                stage = Stage.RENAME
                outcome = self._rename(session, temp, final, overwrite, baseline, attempt_id, record_evidence)
                if outcome is not None:
                    self._remove_temp(temp, attempt_id, session)
                    return outcome
                stage = Stage.CONFIRM
                outcome = self._confirm(session, expected, baseline, overwrite, attempt_id, record_evidence)
                log.info("delivery.finished %s outcome=%s", fields, outcome.status)
                return outcome
        except Exception as exc:
            redact = credential.redactions() if credential is not None else ()
            fresh = None
            if stage in (Stage.UPLOAD, Stage.RENAME, Stage.CONFIRM):
                fresh = self._fresh_listing(final, attempt_id, record_evidence, credential)
            outcome = classify(exc, stage=stage, baseline=baseline, fresh=fresh, redact=redact)
            log.warning(
                "delivery.interrupted %s stage=%s outcome=%s error=%s",
                fields,
                stage.value,
                outcome.status,
                describe(exc, redact=redact),
            )
            if stage in (Stage.UPLOAD, Stage.RENAME):
                self._remove_temp(temp, attempt_id, None, credential)
            return outcome

    def _decide(
        self, baseline: Listing, replacement: bool, replacement_of: ExpectedFile | None, overwrite_agreed: bool
    ) -> bool | Failed:
        """False: upload with the no-overwrite rename; True: overwrite by agreement; or Failed."""
        if not baseline.occupied:
            return False
        if not replacement:
            # An original's name is unique to a delivery key nothing has published yet.
            return Failed(FailureCode.FINAL_NAME_OCCUPIED, "the final name already exists; uploaded nothing")
        # An original that never reached cutoff 2 recorded no expected file: nothing can identify
        # the file as its delivery, so only an agreed overwrite may replace it.
        proof = baseline.proof_for(replacement_of) if replacement_of is not None else Proof.NONE
        if proof.strong or (proof is Proof.NAME_AND_SIZE and self.config.name_and_size_identify):
            return Failed(
                FailureCode.ORIGINAL_DELIVERED,
                f"the final name holds the original's delivery (identified by {proof.value}); uploaded nothing",
            )
        if overwrite_agreed:
            return True
        return Failed(
            FailureCode.FINAL_NAME_OCCUPIED,
            "the final name holds a file not identified as the original's and no overwrite is agreed; "
            "uploaded nothing",
        )

    def _upload(self, session: _Session, local_path: Path, temp: str, expected: ExpectedFile) -> None:
        remote = self.config.remote_path(temp)
        digest = hashlib.sha256()
        size = 0
        # "x": an exclusive create, so a temporary name is never shared even by mistake.
        with local_path.open("rb") as source, session.sftp.open(remote, "wbx") as target:
            target.set_pipelined(True)
            while chunk := source.read(CHUNK_SIZE):
                target.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        # Closing waited for every write's reply. Only the file recorded at cutoff 2 may be published.
        if size != expected.size or digest.digest() != expected.sha256:
            raise UploadMismatch("the local file is not the expected file recorded at cutoff 2")
        if session.sftp.stat(remote).st_size != expected.size:
            raise UploadMismatch("the temporary file's size differs from the expected size")

    def _rename(
        self,
        session: _Session,
        temp: str,
        final: str,
        overwrite: bool,
        baseline: Listing,
        attempt_id: str,
        record_evidence: RecordEvidence,
    ) -> DeliveryOutcome | None:
        """Rename; None when the server confirmed it, an outcome when it refused."""
        source, target = self.config.remote_path(temp), self.config.remote_path(final)
        try:
            if overwrite:
                session.sftp.posix_rename(source, target)
            else:
                session.sftp.rename(source, target)
        except OSError as exc:
            if not _is_status_reply(exc):
                raise  # no reply, or a broken connection: the rename may have run
            # The server answered: it refused. OpenSSH says only "Failure", so look rather than parse.
            fresh = self._list(session, final, with_hash=True)
            self._record(record_evidence, Evidence(EvidenceStage.RENAME_REFUSED, fresh, attempt_id))
            outcome = classify(exc, stage=Stage.RENAME, baseline=baseline, fresh=fresh, rename_refused=True)
            log.warning(
                "delivery.rename_refused attempt_id=%s final_name=%s outcome=%s", attempt_id, final, outcome.status
            )
            return outcome
        return None

    def _confirm(
        self,
        session: _Session,
        expected: ExpectedFile,
        baseline: Listing,
        overwrite: bool,
        attempt_id: str,
        record_evidence: RecordEvidence,
    ) -> DeliveryOutcome:
        after = self._list(session, expected.name, with_hash=True)
        if self.config.acknowledgments and not after.checksum_matches(expected):
            after = self._await_ack(session, after, baseline)
        evidence = Evidence(EvidenceStage.RECEIPT, after, attempt_id)
        self._record(record_evidence, evidence)
        # An acknowledgment only counts if it is new: one already there was for an earlier file.
        fresh_ack = after.ack_matches(expected) and after.ack != baseline.ack
        if after.contradicts(expected):
            return Unknown("after the rename the final name holds a file whose size or hash differs")
        if after.checksum_matches(expected):
            proof = Proof.CHECKSUM
        elif fresh_ack:
            proof = Proof.ACKNOWLEDGMENT
        elif overwrite:
            # Name and size cannot show an overwrite: a rebuilt export can have the same size.
            return Unknown("overwrote the final name but no hash or acknowledgment confirms this upload")
        elif after.present and not baseline.occupied and after.ack is None:
            # Changed from an absent baseline with the expected size, on a server that publishes by
            # atomic rename: reasonable evidence, the weakest Completed accepts.
            proof = Proof.NAME_AND_SIZE
        else:
            return Unknown("the destination does not show the delivered file after the rename")
        receipt = Receipt(
            final_name=expected.name, size=expected.size, proof=proof, overwrote=overwrite, evidence=evidence
        )
        return Completed(receipt)

    def _await_ack(self, session: _Session, after: Listing, baseline: Listing) -> Listing:
        deadline = time.monotonic() + self.config.ack_wait
        ack = after.ack
        while ack is None or ack == baseline.ack:
            if time.monotonic() >= deadline:
                break
            time.sleep(ACK_POLL_INTERVAL)
            ack = self._read_ack(session, after.final_name)
        if ack == after.ack:
            return after
        return Listing(
            final_name=after.final_name,
            present=after.present,
            size=after.size,
            mtime=after.mtime,
            sha256=after.sha256,
            hash_source=after.hash_source,
            ack=ack,
        )

    def _fresh_listing(
        self,
        final: str,
        attempt_id: str,
        record_evidence: RecordEvidence,
        credential: _Credential | None,
    ) -> Listing | None:
        """List the final name on a new connection after an interruption; None if that fails too."""
        if credential is None:
            return None
        try:
            with self._connect(credential) as session:
                fresh = self._list(session, final, with_hash=True)
        except Exception as exc:
            log.warning(
                "delivery.fresh_listing_failed attempt_id=%s final_name=%s error=%s",
                attempt_id,
                final,
                describe(exc, redact=credential.redactions()),
            )
            return None
        self._record(record_evidence, Evidence(EvidenceStage.INTERRUPTED, fresh, attempt_id))
        return fresh

    def _remove_temp(
        self, temp: str, attempt_id: str, session: _Session | None, credential: _Credential | None = None
    ) -> None:
        """Best effort: a leftover temporary file holds contact data and needs the cleanup agreement."""
        path = self.config.remote_path(temp)
        try:
            if session is not None:
                session.sftp.remove(path)
            elif credential is not None:
                with self._connect(credential) as fresh_session:
                    fresh_session.sftp.remove(path)
            else:
                return
        except FileNotFoundError:
            return
        except Exception as exc:
            redact = credential.redactions() if credential is not None else ()
            log.warning(
                "delivery.temp_cleanup_failed attempt_id=%s temp_name=%s error=%s",
                attempt_id,
                temp,
                describe(exc, redact=redact),
            )
            return
        log.info("delivery.temp_removed attempt_id=%s temp_name=%s", attempt_id, temp)

    @staticmethod
    def _record(record_evidence: RecordEvidence, evidence: Evidence) -> None:
        # Later evidence is a bonus: the outcome carries it too, so a failing recorder must not turn
        # a delivered file into an unknown one.
        try:
            record_evidence(evidence)
        except Exception as exc:
            log.warning("delivery.evidence_not_recorded stage=%s error=%s", evidence.stage.value, describe(exc))
