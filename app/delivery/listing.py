"""Looking at what a final name holds on an open session: the file's size and time, its hash where the
partner's contract offers one, and the partner's acknowledgment file. Reads only; every delivery stage
and recovery's inspection observe through here.
"""

from __future__ import annotations

import hashlib
import stat as stat_module
import time

from app.delivery.config import DestinationConfig
from app.delivery.evidence import Listing
from app.delivery.session import Session

#: Seconds between two reads of the acknowledgment file while waiting for it.
ACK_POLL_INTERVAL = 0.05
#: The partner writes ``<final>.ack`` holding the sha256 hex of the file it accepted.
ACK_SUFFIX = ".ack"
#: An acknowledgment file larger than this is not an acknowledgment, in bytes.
MAX_ACK_BYTES = 1024
#: A completion marker larger than this is not ours (a manifest is a few hundred bytes).
MAX_MARKER_BYTES = 64 * 1024


def temp_name(name: str, attempt_id: str) -> str:
    """The temporary name an attempt writes a file (or its marker) under before the rename; the partner
    agrees to ignore dot-files ending in .part, and the attempt id keeps two attempts apart."""
    return f".{name}.{attempt_id}.part"


def ack_name(final_name: str) -> str:
    """The partner's acknowledgment file for a final name."""
    return final_name + ACK_SUFFIX


def list_final(session: Session, config: DestinationConfig, final_name: str, *, with_hash: bool,
               marker_name: str | None = None) -> Listing:
    """What the destination shows now under ``final_name`` (and its completion marker, when named)."""
    path = config.remote_path(final_name)
    ack = read_ack(session, config, final_name) if config.acknowledgments else None
    marker = read_marker(session, config, marker_name) if marker_name is not None else None
    try:
        attrs = session.sftp.stat(path)
    except FileNotFoundError:
        return Listing(final_name=final_name, present=False, ack=ack, marker=marker)
    if attrs.st_mode is not None and not stat_module.S_ISREG(attrs.st_mode):
        # A directory or special file still occupies the name; it just cannot be a delivery.
        return Listing(final_name=final_name, present=True, size=None, mtime=attrs.st_mtime, ack=ack, marker=marker)
    digest, source = (None, None)
    if with_hash:
        digest, source = _hash(session, config, path)
    return Listing(final_name=final_name, present=True, size=attrs.st_size, mtime=attrs.st_mtime, sha256=digest,
                   hash_source=source, ack=ack, marker=marker)


def read_marker(session: Session, config: DestinationConfig, marker_name: str) -> str | None:
    """The sha256 (hex) of the completion marker's content; None when there is none."""
    try:
        with session.sftp.open(config.remote_path(marker_name), "rb") as remote:
            raw = remote.read(MAX_MARKER_BYTES + 1)
    except FileNotFoundError:
        return None
    return "<oversized>" if len(raw) > MAX_MARKER_BYTES else hashlib.sha256(raw).hexdigest()


def _hash(session: Session, config: DestinationConfig, path: str) -> tuple[bytes | None, str | None]:
    if config.remote_hash:
        digest = session.remote_sha256(path)
        if digest is not None:
            return digest, "check-file-name"
    if config.read_back:
        return session.read_back_sha256(path), "read-back"
    return None, None


def read_ack(session: Session, config: DestinationConfig, final_name: str) -> str | None:
    path = config.remote_path(ack_name(final_name))
    try:
        with session.sftp.open(path, "rb") as remote:
            raw = remote.read(MAX_ACK_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_ACK_BYTES:
        return "<oversized>"
    return raw.decode("ascii", errors="replace").strip().lower()


def await_ack(session: Session, config: DestinationConfig, after: Listing, baseline: Listing) -> Listing:
    """``after`` with the partner's acknowledgment, once one differs from the baseline's or the contract's
    wait runs out."""
    deadline = time.monotonic() + config.ack_wait
    ack = after.ack
    while ack is None or ack == baseline.ack:
        if time.monotonic() >= deadline:
            break
        time.sleep(ACK_POLL_INTERVAL)
        ack = read_ack(session, config, after.final_name)
    if ack == after.ack:
        return after
    return Listing(final_name=after.final_name, present=after.present, size=after.size, mtime=after.mtime,
                   sha256=after.sha256, hash_source=after.hash_source, ack=ack, marker=after.marker)
