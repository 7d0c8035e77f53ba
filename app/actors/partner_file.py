"""The partner's file as its delivery profile shapes it: the rows PostgreSQL writes, then what the profile
adds around them (a byte order mark, a header line, CRLF line endings), the compression, and OpenPGP.

``plaintext`` is the file before compression, block by block: the build writes it through a ``Sink``
into ``output`` (the file, or gpg writing it), and ``exports preview`` prints its first rows as they are.
Memory stays flat: one block at a time.
"""

from __future__ import annotations

import csv
import hashlib
import io
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from uuid import UUID

import psycopg

from app.delivery.openpgp import Encryptor, parse_signing_ref
from app.delivery.profile import Compression, Format, LineEnding, Profile, Quoting
from app.store import worker as worker_reads

BOM = b"\xef\xbb\xbf"
#: gzip's own default, what ``gzip`` on the command line does: a partner's tools expect its ratio.
GZIP_LEVEL = 6


def copy_shape(profile: Profile, incremental: bool = False) -> worker_reads.ContactsCopy:
    sources = tuple(("attributes", c.attribute) if c.attribute is not None else c.source for c in profile.columns)
    if profile.format is Format.JSONL:
        return worker_reads.ContactsCopy(sources, json_keys=tuple(c.header for c in profile.columns),
                                         change_column=incremental)
    return worker_reads.ContactsCopy(sources, delimiter=profile.delimiter, quote_all=profile.quoting is Quoting.ALL,
                                     neutralize_formulas=profile.neutralize_formulas, change_column=incremental)


def preamble(profile: Profile, incremental: bool = False) -> bytes:
    """What comes before the first row: the BOM, and the header line (quoted as the rows are), which an
    incremental export ends with its ``_change`` column."""
    head = BOM if profile.bom else b""
    if profile.format is Format.CSV and profile.header:
        line = io.StringIO()
        headers = [c.header for c in profile.columns] + ([worker_reads.CHANGE_COLUMN] if incremental else [])
        csv.writer(line, delimiter=profile.delimiter, lineterminator=_newline(profile).decode(),
                   quoting=csv.QUOTE_ALL if profile.quoting is Quoting.ALL else csv.QUOTE_MINIMAL,
                   ).writerow(headers)
        head += line.getvalue().encode("utf-8")
    return head


def plaintext(conn: psycopg.Connection, tenant_id: UUID, profile: Profile, block_bytes: int,
              limit: int | None = None, changes: Changes | None = None) -> Iterator[tuple[bytes | bytearray, int]]:
    """The file before compression, in blocks of about ``block_bytes``, each with how many rows it holds.
    The first block carries the preamble (an empty tenant still gets its header). With ``changes``, an
    incremental export's rows (run inside the transaction whose snapshot the build records)."""
    crlf = profile.line_ending is LineEnding.CRLF
    jsonl = profile.format is Format.JSONL
    head = preamble(profile, incremental=changes is not None)
    source = worker_reads.consenting_contacts(conn, tenant_id, copy_shape(profile), block_bytes, limit=limit) \
        if changes is None else worker_reads.changed_contacts(conn, tenant_id, changes.since,
                                                              copy_shape(profile, incremental=True), block_bytes,
                                                              limit=limit)
    with source as blocks:
        for block, rows in blocks:
            data: bytes | bytearray = block
            if crlf:
                data = bytes(block).replace(b"\n", b"\r\n") if jsonl else _crlf_lines(block)
            if head:
                data, head = head + data, b""
            yield data, rows
    if head:
        yield head, 0


@dataclass(frozen=True)
class Changes:
    """An incremental export: the contacts changed since ``since`` (pg_snapshot's text; None: all of them)."""

    since: str | None = None


def _newline(profile: Profile) -> bytes:
    return b"\r\n" if profile.line_ending is LineEnding.CRLF else b"\n"


def _crlf_lines(block: bytearray) -> bytes:
    """CSV rows ended with CRLF instead of LF; a line break inside a quoted field stays as the data has it.
    A block starts at a row's start, outside quotes, and PostgreSQL doubles a quote inside a field, so
    the text between the n-th and n+1-th quote is outside a field exactly when n is even."""
    if b'"' not in block:
        return bytes(block).replace(b"\n", b"\r\n")
    parts = bytes(block).split(b'"')
    parts[::2] = [part.replace(b"\n", b"\r\n") for part in parts[::2]]
    return b'"'.join(parts)


class Writable(Protocol):
    def write(self, data: bytes | bytearray, /) -> object: ...


@contextmanager
def output(path: Path, profile: Profile) -> Iterator[tuple[Writable, Encryptor | None]]:
    """Where the build writes: the new file itself, or, for an encrypted profile, gpg, which writes it. On
    an error (a stop included) gpg is killed and its partial output removed; the caller removes the rest.
    Leaving without an error, the caller finishes the encryptor."""
    if not profile.encrypt_to:
        with path.open("xb") as out:
            yield out, None
        return
    signer = parse_signing_ref(profile.sign_with) if profile.sign_with else None
    path.touch(exist_ok=False)   # as "xb" would: never over another attempt's file
    with Encryptor(path, profile.encrypt_to, signer=signer) as encryptor:
        yield encryptor, encryptor


def file_digest(path: Path) -> tuple[int, bytes]:
    """Size and SHA-256 of a file gpg wrote, read back from the page cache it is still in."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.digest()


class Sink:
    """Writes the file: compressed as the profile says, sized and hashed as it goes (what cutoff 2
    records is the file the partner receives, compression and all; an encrypted file is hashed once gpg
    has written it, by ``file_digest``).

    Compression runs on a thread of its own, at most ``GZIP_QUEUE_BLOCKS`` blocks behind the COPY that
    feeds it: zlib lets go of the GIL while it deflates, so reading rows and compressing them overlap,
    as ``psql | gzip`` overlaps them in two processes (serial, a gzip build took the sum of both). Use it
    as a context manager: leaving on an error ends the thread and drops what it had not written.
    """

    def __init__(self, out: Writable, compression: Compression) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.size = 0
        self._compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if compression is Compression.GZIP \
            else None
        self._behind: _Behind | None = _Behind(self._compress) if self._compressor is not None else None

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if self._behind is not None:
            self._behind.close(drop=error is not None)

    def write(self, data: bytes | bytearray) -> None:
        if self._behind is not None:
            self._behind.put(data)
        else:
            self._put(data)

    def finish(self) -> None:
        """Writes what is left; raises what the compressing thread raised."""
        if self._behind is not None:
            self._behind.close(drop=False)
            assert self._compressor is not None
            self._put(self._compressor.flush())

    def _compress(self, data: bytes | bytearray) -> None:
        assert self._compressor is not None
        self._put(self._compressor.compress(data))

    def _put(self, data: bytes | bytearray) -> None:
        if data:
            self.out.write(data)
            self.digest.update(data)
            self.size += len(data)


#: Blocks the compressing thread may lag behind the COPY: memory stays bounded by this many blocks.
GZIP_QUEUE_BLOCKS = 4


class _Behind:
    """Runs ``work`` over blocks on a thread of its own, in order. The first error is kept and raised to
    the producer at its next ``put`` or at ``close``; blocks after it are dropped, never left unread, so a
    producer never waits on a thread that stopped taking them."""

    _END = object()

    def __init__(self, work: Callable[[bytes | bytearray], None]) -> None:
        self._work = work
        self._blocks: queue.Queue[object] = queue.Queue(GZIP_QUEUE_BLOCKS)
        self._error: BaseException | None = None
        self._dropping = False
        self._thread = threading.Thread(target=self._run, name="partner-file-gzip", daemon=True)
        self._thread.start()
        self._closed = False

    def put(self, block: bytes | bytearray) -> None:
        self._raise()
        self._blocks.put(block)

    def close(self, *, drop: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._dropping = drop
        self._blocks.put(self._END)
        self._thread.join()
        if not drop:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (block := self._blocks.get()) is not self._END:
            if self._error is None and not self._dropping:
                try:
                    self._work(block)   # type: ignore[arg-type]
                except BaseException as exc:
                    self._error = exc
