"""Workload 11's pieces with no database and no gpg: the ceiling's command line, reading a decrypted file,
the check that both contenders wrote the same file, and the rows."""

from __future__ import annotations

import gzip
import hashlib
import shlex
import uuid
from pathlib import Path

import pytest

from bench import partner_files
from bench.harness import Outcome
from bench.workloads import partner_files as workload

TENANT = uuid.UUID("00000000-0000-4000-8000-000000000001")
ROWS = b"email,full_name,company,phone\na@example.com,A,C,+1\nb@example.com,B,C,+2\n"


def test_the_ceiling_is_psql_copying_the_builders_query_through_gzip_6_into_gpg_encrypting_to_the_key():
    script = partner_files.pipeline_script("postgresql://postgres@127.0.0.1:5432/exports_bench_x", TENANT,
                                           Path("/keys/ceiling gpg"), "ABCDEF0123", Path("/work/out.gpg"))
    psql, gzip_, gpg = (shlex.split(part) for part in script.split(" | "))

    assert psql[:2] == ["psql", "-q"] and psql[-2] == "-c"
    assert psql[-1] == (f"\\copy (SELECT email, full_name, company, phone FROM contacts WHERE tenant_id = '{TENANT}' "
                        "AND consent ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER true, ENCODING 'UTF8')")
    assert gzip_ == ["gzip", "-6"]
    assert gpg == ["gpg", "--homedir", "/keys/ceiling gpg", "--encrypt", "--recipient", "ABCDEF0123",
                   "--trust-model", "always", "--compress-algo", "none", "--batch", "-o", "/work/out.gpg"]


def test_a_gzip_stream_is_read_whole_in_chunks_cut_anywhere_every_member_of_it():
    stream = gzip.compress(ROWS[:40]) + gzip.compress(ROWS[40:])
    read = partner_files.gunzip(stream[i:i + 7] for i in range(0, len(stream), 7))

    assert read == partner_files.Gunzipped(len(ROWS), hashlib.sha256(ROWS).hexdigest(), 3, partner_files.HEADER)
    with pytest.raises(ValueError, match="cut short"):
        partner_files.gunzip([stream[:-5]])


def _text(sha256: str = "s" * 64, header: bytes = partner_files.HEADER, lines: int = 901, cipher: str = "AES-256"):
    return partner_files.Plaintext(1000, sha256, lines, header, cipher, 100)


def test_the_rounds_run_only_when_both_files_decrypt_to_the_same_rows_under_the_same_cipher():
    workload._check(_text(), _text(), 900, 1000)
    for theirs, problem in ((_text(sha256="t" * 64), "other bytes"), (_text(lines=900), "lines"),
                            (_text(header=b"email"), "header"), (_text(cipher="AES-128"), "AES-128")):
        with pytest.raises(RuntimeError, match=problem):
            workload._check(_text(), theirs, 900, 1000)


def test_the_rows_give_plaintext_mib_per_second_against_the_pipeline_and_memory_against_the_file():
    outcome = Outcome()
    runs = {"ours": [partner_files.Run(s, 1.0, 0.1) for s in (2.0, 2.2, 1.9)],
            "pipeline": [partner_files.Run(s, 0.0, 1.2) for s in (1.6, 1.7, 1.5)]}
    text = partner_files.Plaintext(100 * 2**20, "s" * 64, 900_001, partner_files.HEADER, "AES-256", 14 * 2**20)
    workload._rows(outcome, 1_000_000, text, text, runs, [0.07, 0.08, 0.06])
    memory = {100_000: [partner_files.Memory(50_000, 51_024, 51_000, 0.3, 90_000, 2000)],
              1_000_000: [partner_files.Memory(50_000, 51_536, 51_500, 2.0, 900_000, 2100)]}
    workload._memory_rows(outcome, memory, 100_000, 1_000_000, text.size)
    rate, *_ = outcome.rows
    growth = next(r for r in outcome.rows if r.ceiling_name == "the file's plaintext")

    assert rate.unit == "MiB/s" and rate.ours.median == 50 and rate.ceiling.median == 100 / 1.6
    assert rate.ratio == pytest.approx(0.8) and rate.met is True
    # 1.5 MiB over a 100 MiB file: flat (at most 1/16 of it).
    assert (growth.ours.median, growth.ceiling.median, growth.met) == (1.5, 100, True)
