"""The builder writing a partner's file compressed and encrypted (gzip, then OpenPGP to the partner's key)
against the shell pipeline a DBA would write for the same file.

Ours: ``ContactsBuilder.build`` with a profile of the default columns, ``compression=gzip`` and
``encrypt_to=(the partner's key,)``, no signing: COPY TO STDOUT, zlib at level 6 in the builder's thread,
then one gpg process (``app.delivery.openpgp.Encryptor``) writing the file. The ceiling, on the same
tenant and the same query:

    psql -c "\\copy (QUERY) TO STDOUT WITH (FORMAT csv, HEADER true, ENCODING 'UTF8')" | gzip -6 \\
        | gpg --homedir HOME --encrypt --recipient FPR --trust-model always --compress-algo none --batch -o FILE

three processes side by side, gpg in a home of its own holding only the partner's public key (the same
key, so the same cipher preferences; ``decrypt`` reads which cipher each file used). The partner's
keypair is a real gpg one (``tests.fixtures.openpgp.make_party``): its home decrypts both files, and the
plaintexts are compared byte for byte (PostgreSQL's ``HEADER true`` line and the builder's own header
line are the same for the default profile).

Memory: ``rss`` runs one build in a process of its own (``python -m bench.partner_files --rss-child``),
warmed up on a small tenant first, and samples its VmRSS from outside (``bench.procstat``) from just
before the build to its end; the child also reports its VmHWM, reset after the warm-up, the exact peak.

    python -m bench.partner_files [--contacts 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from app.actors.builder import BuiltFile, ContactsBuilder
from app.actors.policy import Scope
from app.actors.stop import StopSignal
from app.delivery.openpgp import PartnerKey, parse_public_key
from app.delivery.profile import Compression, Profile
from bench import build_export, procstat
from bench._scratch import base_url, create, drop
from tests.fixtures.openpgp import Party, make_party

ROOT = Path(__file__).resolve().parent.parent
#: The smaller size memory is measured at, to show that what a build adds does not grow with the file.
SMALL_CONTACTS = 100_000
#: The tenant each memory child builds first (imports, the pool's connection, the keyring home, gpg).
WARM_CONTACTS = 10_000
#: Seconds between RSS samples of a memory child while it builds.
SAMPLE_INTERVAL = 0.01
CHILD_TIMEOUT = 300.0
#: The header line of the default profile, which PostgreSQL's ``HEADER true`` writes too.
HEADER = b"email,full_name,company,phone"
#: OpenPGP symmetric algorithm ids (RFC 4880 9.2) gpg's DECRYPTION_INFO status names.
CIPHERS = {"7": "AES-128", "8": "AES-192", "9": "AES-256", "10": "Twofish", "11": "Camellia-128",
           "12": "Camellia-192", "13": "Camellia-256", "2": "3DES", "3": "CAST5"}


# --- the partner -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partner:
    """The partner's keypair (its home holds the secret key and decrypts), the key as a destination holds
    it, and the ceiling's gpg home, which holds the public key only."""

    party: Party
    key: PartnerKey
    ceiling_home: Path
    key_file: Path


def _kill_agent(home: Path) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, timeout=10,
                       check=False)


@contextlib.contextmanager
def partner(root: Path) -> Iterator[Partner]:
    """A partner keypair under ``root`` (removed afterwards, the gpg-agents its homes started stopped)."""
    root.mkdir(parents=True, exist_ok=True)
    party = make_party(root, "partner")
    ceiling_home = root / "ceiling-gpg"
    try:
        ceiling_home.mkdir(mode=0o700)
        subprocess.run(["gpg", "--homedir", str(ceiling_home), "--batch", "--import"], input=party.public.encode(),
                       capture_output=True, check=True, timeout=60)
        key_file = root / "partner.asc"
        key_file.write_text(party.public, encoding="utf-8")
        yield Partner(party, parse_public_key(party.public), ceiling_home, key_file)
    finally:
        for home in (party.home, ceiling_home):
            _kill_agent(home)
        shutil.rmtree(root, ignore_errors=True)


def profile(key: PartnerKey) -> Profile:
    """The default columns, gzip, encrypted to ``key``, not signed."""
    return Profile.checked(compression=Compression.GZIP, encrypt_to=(key,))


# --- the contenders --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One contender's run: wall seconds, and CPU seconds of this process (the builder's Python; none for the
    pipeline) and of the children it waited for meanwhile (the builder's gpg; the pipeline's bash, psql, gzip
    and gpg). The PostgreSQL backend's is neither: it runs the same COPY for both."""

    seconds: float
    cpu_self: float
    cpu_children: float


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def build(builder: ContactsBuilder, tenant: uuid.UUID, partner_profile: Profile) -> tuple[Run, BuiltFile]:
    """One build of the partner's file; the run and the file (the caller deletes it)."""
    cpu = _cpu()
    started = time.perf_counter()
    built = builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant,
                          scope=Scope.CONSENTING_CONTACTS, stop=StopSignal(), profile=partner_profile)
    elapsed = time.perf_counter() - started
    own, children = _cpu()
    return Run(elapsed, own - cpu[0], children - cpu[1]), built


def pipeline_script(url: str, tenant: uuid.UUID, home: Path, fingerprint: str, out: Path) -> str:
    """The ceiling's shell pipeline: psql's ``\\copy`` of the builder's query | gzip -6 | gpg."""
    query = build_export.QUERY.format(tenant=f"'{tenant}'")
    copy = f"\\copy ({query}) TO STDOUT WITH {build_export.OPTIONS}"
    psql = " ".join(shlex.quote(arg) for arg in build_export._psql(url))
    gpg = ["gpg", "--homedir", str(home), "--encrypt", "--recipient", fingerprint, "--trust-model", "always",
           "--compress-algo", "none", "--batch", "-o", str(out)]
    return f"{psql} -c {shlex.quote(copy)} | gzip -6 | {' '.join(shlex.quote(arg) for arg in gpg)}"


def pipeline(url: str, tenant: uuid.UUID, found: Partner, out: Path) -> Run:
    """The ceiling's pipeline writing ``out``, psql's and gpg's start-up included."""
    script = pipeline_script(url, tenant, found.ceiling_home, found.key.fingerprint, out)
    out.unlink(missing_ok=True)   # gpg --batch does not overwrite
    cpu = _cpu()
    started = time.perf_counter()
    subprocess.run(["bash", "-o", "pipefail", "-c", script], check=True)
    elapsed = time.perf_counter() - started
    own, children = _cpu()
    return Run(elapsed, 0.0, children - cpu[1])


# --- what the partner gets -------------------------------------------------------------------------


@dataclass(frozen=True)
class Gunzipped:
    """What a gzip stream holds: its size, SHA-256, newlines and first line (without its newline)."""

    size: int
    sha256: str
    lines: int
    header: bytes


def gunzip(chunks: Iterable[bytes]) -> Gunzipped:
    """Decompresses a gzip stream as it comes, every member of it (``gzip`` may write several), in chunks
    cut anywhere. ValueError when the stream is cut short."""
    digest = hashlib.sha256()
    size = lines = 0
    head = b""
    inflate = zlib.decompressobj(wbits=31)
    started = False
    for chunk in chunks:
        while chunk:
            if inflate.eof:   # the next member
                inflate = zlib.decompressobj(wbits=31)
            started = True
            data = inflate.decompress(chunk)
            chunk = inflate.unused_data
            digest.update(data)
            size += len(data)
            lines += data.count(b"\n")
            if b"\n" not in head and len(head) <= len(HEADER):
                head += data[:len(HEADER) + 1]
    if started and not inflate.eof:
        raise ValueError("the gzip stream is cut short")
    return Gunzipped(size, digest.hexdigest(), lines, head.split(b"\n", 1)[0])


@dataclass(frozen=True)
class Plaintext(Gunzipped):
    """A partner file decrypted with the partner's secret key and gunzipped."""

    cipher: str
    #: The encrypted file's own size.
    file_size: int


def decrypt(path: Path, home: Path) -> Plaintext:
    """Decrypts ``path`` in the partner's ``home`` and gunzips it as it streams; which cipher it was."""
    with tempfile.TemporaryFile() as status:
        proc = subprocess.Popen(["gpg", "--homedir", str(home), "--batch", "--quiet", "--status-fd", "2",
                                 "--decrypt", str(path)], stdout=subprocess.PIPE, stderr=status)
        assert proc.stdout is not None
        with proc.stdout:
            text = gunzip(iter(lambda: proc.stdout.read(1 << 20), b""))
        if proc.wait() != 0:
            status.seek(0)
            raise RuntimeError(f"gpg could not decrypt {path.name}: {status.read().decode(errors='replace')[-500:]}")
        status.seek(0)
        info = [line.split() for line in status.read().decode(errors="replace").splitlines()
                if line.startswith("[GNUPG:] DECRYPTION_INFO")]
    # DECRYPTION_INFO <mdc method> <symmetric algorithm> [<aead algorithm>]
    algo = info[0][3] if info and len(info[0]) > 3 else "?"
    return Plaintext(text.size, text.sha256, text.lines, text.header, CIPHERS.get(algo, f"algorithm {algo}"),
                     path.stat().st_size)


# --- memory ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """One build in a process of its own: its VmRSS before it, the largest sampled while it ran, its VmHWM
    reset after the warm-up (the exact peak), and the build's seconds and rows."""

    before_kib: int
    peak_kib: int
    hwm_kib: int
    seconds: float
    rows: int
    #: The peak of Python's own allocations (tracemalloc) over a second build of the same tenant; 0: not traced.
    python_peak_kib: int = 0

    @property
    def growth_kib(self) -> int:
        return self.peak_kib - self.before_kib


def rss(url: str, work: Path, key_file: Path, warm_tenant: uuid.UUID, tenant: uuid.UUID, *,
        trace: bool = False) -> Memory:
    """The builder's RSS over one build of ``tenant``, in a fresh process warmed up on ``warm_tenant``; with
    ``trace``, the child then builds it again under tracemalloc (slower: never the timed or sampled build)."""
    config = json.dumps({"url": url, "work": str(work), "key_file": str(key_file), "warm_tenant": str(warm_tenant),
                         "tenant": str(tenant), "trace": trace})
    proc = subprocess.Popen([sys.executable, "-m", "bench.partner_files", "--rss-child", config], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the memory child exited with {proc.wait()} before its build")
        before = procstat.rss_kib(proc.pid) or 0
        peak = before
        readable = select.poll()
        readable.register(proc.stdout, select.POLLIN)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not readable.poll(SAMPLE_INTERVAL * 1000):
            peak = max(peak, procstat.rss_kib(proc.pid) or 0)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the memory child's build did not end within {CHILD_TIMEOUT:.0f} s")
        line = proc.stdout.readline()
        if proc.wait(timeout=60) != 0 or not line:
            raise RuntimeError(f"the memory child failed (exit status {proc.returncode})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = json.loads(line)
    return Memory(before, max(peak, done["rss_kib"]), done["hwm_kib"], done["seconds"], done["rows"],
                  done["python_peak_kib"])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rss_child(config_text: str) -> None:
    config = json.loads(config_text)
    partner_profile = profile(parse_public_key(Path(config["key_file"]).read_text(encoding="utf-8")))
    builder = ContactsBuilder(config["url"], Path(config["work"]))
    try:
        build(builder, uuid.UUID(config["warm_tenant"]), partner_profile)[1].delete()
        # VmHWM from here on: 5 resets the peak to the current RSS (proc(5), clear_refs).
        Path("/proc/self/clear_refs").write_text("5")
        print("ready", flush=True)
        sys.stdin.readline()
        run, built = build(builder, uuid.UUID(config["tenant"]), partner_profile)
        hwm, now = _status_kib("VmHWM"), _status_kib("VmRSS")
        built.delete()
        python_peak = 0
        if config["trace"]:
            tracemalloc.start()
            build(builder, uuid.UUID(config["tenant"]), partner_profile)[1].delete()
            python_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    finally:
        builder.close()
    print(json.dumps({"seconds": run.seconds, "rows": built.rows, "hwm_kib": hwm, "rss_kib": now,
                      "python_peak_kib": python_peak // 1024}), flush=True)


# --- alone -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contacts", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rss-child", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child)
        return
    base = base_url()
    name = f"exports_bench_partner_files_{os.getpid()}"
    url = create(base, name)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "work"
            work.mkdir()
            with psycopg.connect(url, autocommit=True) as owner:
                warm = build_export.seed(owner, WARM_CONTACTS)
                tenant = build_export.seed(owner, args.contacts)
            with partner(Path(tmp) / "keys") as found:
                partner_profile = profile(found.key)
                builder = ContactsBuilder(url, work)
                _, built = build(builder, tenant, partner_profile)   # warm-up, and the comparison
                theirs = work / "pipeline.csv.gz.gpg"
                pipeline(url, tenant, found, theirs)
                ours_text, theirs_text = decrypt(built.path, found.party.home), decrypt(theirs, found.party.home)
                built.delete()
                ours = pipe = float("inf")
                for _ in range(args.runs):
                    pipe = min(pipe, pipeline(url, tenant, found, theirs).seconds)
                    run, built = build(builder, tenant, partner_profile)
                    built.delete()
                    ours = min(ours, run.seconds)
                builder.close()
                memory = rss(url, work, found.key_file, warm, tenant)
        mib = ours_text.size / 2**20
        same = "identical" if ours_text.sha256 == theirs_text.sha256 else "DIFFERENT"
        print(f"{args.contacts:,} contacts, {mib:.1f} MiB of plaintext, {same} after decryption "
              f"({ours_text.cipher} / {theirs_text.cipher}; best of {args.runs}):")
        print(f"  builder  {ours:6.2f} s  {mib / ours:6.1f} MiB/s  {ours_text.file_size / 2**20:5.1f} MiB file")
        print(f"  pipeline {pipe:6.2f} s  {mib / pipe:6.1f} MiB/s  {theirs_text.file_size / 2**20:5.1f} MiB file")
        print(f"  ratio {pipe / ours:.2f}; builder RSS {memory.before_kib / 1024:.1f} MiB before, "
              f"{memory.peak_kib / 1024:.1f} MiB peak (VmHWM {memory.hwm_kib / 1024:.1f} MiB)")
    finally:
        drop(base, name)


if __name__ == "__main__":
    main()
