"""What the builder adds around PostgreSQL's rows: the BOM and the header line as the profile quotes
them, CRLF line endings that leave a line break inside a quoted field alone, and gzip that the
standard library reads back."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io

import pytest

from app.actors import partner_file
from app.delivery.profile import Column, Compression, Format, LineEnding, Profile, Quoting


@pytest.mark.parametrize("block", [
    b'a,b\nc,d\n',
    b'"x\ny",z\n"q""\n""",w\n',
    b'"",""\n,\n"a\r\nb"\n',
])
def test_crlf_ends_each_record_and_keeps_each_quoted_line_break_as_the_data_has_it(block):
    converted = partner_file._crlf_lines(bytearray(block))

    rows = list(csv.reader(io.StringIO(converted.decode(), newline="")))
    assert rows == list(csv.reader(io.StringIO(block.decode(), newline="")))
    assert converted.count(b"\r\n") - block.count(b"\r\n") == len(rows)


def test_the_preamble_is_the_bom_then_the_header_quoted_and_ended_as_the_rows_are():
    profile = Profile.checked(columns=(Column("email", 'E "mail"'), Column("phone", "Tel;")), delimiter=";",
                              quoting=Quoting.ALL, line_ending=LineEnding.CRLF, bom=True)

    assert partner_file.preamble(profile) == b'\xef\xbb\xbf"E ""mail""";"Tel;"\r\n'
    assert partner_file.preamble(Profile.checked(header=False)) == b""
    assert partner_file.preamble(Profile.checked(format=Format.JSONL)) == b""


def test_a_gzip_sink_writes_what_gzip_reads_back_and_sizes_and_hashes_the_compressed_bytes():
    out = io.BytesIO()
    sink = partner_file.Sink(out, Compression.GZIP)
    for i in range(1000):
        sink.write(f"row {i}\n".encode())
    sink.finish()

    written = out.getvalue()
    assert gzip.decompress(written) == b"".join(f"row {i}\n".encode() for i in range(1000))
    assert sink.size == len(written)

    assert sink.digest.digest() == hashlib.sha256(written).digest()


class _FailingAt:
    """A file whose ``n``-th write fails, as a full disk or a gpg that went away does."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.writes = 0

    def write(self, data):
        self.writes += 1
        if self.writes >= self.n:
            raise OSError(28, "No space left on device")


def test_an_error_on_the_compressing_thread_reaches_the_build_and_later_blocks_are_not_written():
    out = _FailingAt(1)
    sink = partner_file.Sink(out, Compression.GZIP)
    with pytest.raises(OSError, match="No space left"):
        with sink:
            # Incompressible blocks, so the compressor writes as it goes; the build learns of the error at
            # a later write at the latest, however far behind the thread is.
            for _ in range(50):
                sink.write(hashlib.sha256(str(_).encode()).digest() * 8192)
            sink.finish()
    assert out.writes == 1


def test_leaving_a_sink_on_a_stop_with_its_queue_full_returns_and_drops_what_was_not_written():
    written = []

    class Slow:
        def write(self, data):
            written.append(len(data))

    sink = partner_file.Sink(Slow(), Compression.GZIP)
    with pytest.raises(KeyboardInterrupt):
        with sink:
            for i in range(partner_file.GZIP_QUEUE_BLOCKS * 4):
                sink.write(hashlib.sha256(str(i).encode()).digest() * 8192)
            raise KeyboardInterrupt   # a stop raised by the build between blocks
    assert not sink._behind._thread.is_alive()
