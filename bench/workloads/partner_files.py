"""Workload 11: a partner file built compressed and encrypted (issue 17), against the shell pipeline a DBA
would write for the same file, in the same run.

A million contacts (``bench.build_export.seed``: nine in ten consenting, about 55 MiB of CSV), built by
``ContactsBuilder.build`` with a profile of the default columns, ``compression=gzip`` and
``encrypt_to=(one partner key,)``, not signed; the ceiling is ``psql \\copy (the same query) TO STDOUT |
gzip -6 | gpg --encrypt --recipient FPR --trust-model always --compress-algo none --batch -o FILE``, gpg in
a home of its own holding the partner's public key (``bench.partner_files``). Before the rounds, one
file of each is decrypted with the partner's secret key and gunzipped: the plaintexts must be the same
bytes (the default profile's header line is PostgreSQL's ``HEADER true`` line), or the workload fails.

Then the rounds, the contenders' order (and psql's start-up, timed on its own as in the large export)
alternating between them; figures are MiB/s of plaintext. Last, the builder's memory: one build per
size in a process of its own, warmed up on a build of the same tenant (a worker's steady state; the first
large build of a process adds a one-off 1-2 MiB high-water mark), its VmRSS sampled from outside from
just before the build to its end, at 100,000 and at a million contacts, the sizes' order alternating.
"""

from __future__ import annotations

import statistics

import psycopg

from app.actors import partner_file
from app.actors.builder import ContactsBuilder
from bench import build_export, partner_files
from bench.harness import Context, Outcome, Row, Stat, Workload, at_least, at_most, log, settle


def _label(count: int, size: int) -> str:
    return f"{count:,} contacts ({size / 2**20:.0f} MiB of CSV)"


def run(ctx: Context) -> Outcome:
    outcome = Outcome()
    count, small = ctx.sizes.large_contacts, partner_files.SMALL_CONTACTS
    state = ctx.work_dir / "partner-files"
    work = state / "work"
    work.mkdir(parents=True, exist_ok=True)
    url = ctx.fresh_database("partner_files")
    with psycopg.connect(url, autocommit=True) as owner:
        smaller = build_export.seed(owner, small)
        tenant = build_export.seed(owner, count)
    settle(url)
    with partner_files.partner(state / "keys") as partner:
        profile = partner_files.profile(partner.key)
        builder = ContactsBuilder(url, work)
        try:
            # Warm-up of both, and the check that they wrote the same file for the partner.
            _, built = partner_files.build(builder, tenant, profile)
            theirs_file = work / "pipeline.csv.gz.gpg"
            partner_files.pipeline(url, tenant, partner, theirs_file)
            ours_text = partner_files.decrypt(built.path, partner.party.home)
            theirs_text = partner_files.decrypt(theirs_file, partner.party.home)
            rows = built.rows
            built.delete()
            theirs_file.unlink()
            _check(ours_text, theirs_text, rows, count)
            runs: dict[str, list[partner_files.Run]] = {"ours": [], "pipeline": []}
            startups: list[float] = []

            def ours() -> None:
                run_, built_ = partner_files.build(builder, tenant, profile)
                built_.delete()
                runs["ours"].append(run_)

            steps = [lambda: runs["pipeline"].append(partner_files.pipeline(url, tenant, partner, theirs_file)),
                     lambda: startups.append(build_export.psql_startup(url)),
                     ours]
            for round_ in range(ctx.repeats):
                for step in (steps if round_ % 2 == 0 else steps[::-1]):
                    step()
                log(f"   partner files round {round_ + 1}: builder {runs['ours'][-1].seconds:.2f} s, "
                    f"pipeline {runs['pipeline'][-1].seconds:.2f} s")
        finally:
            builder.close()
            (work / "pipeline.csv.gz.gpg").unlink(missing_ok=True)
        memory: dict[int, list[partner_files.Memory]] = {small: [], count: []}
        tenants = [(small, smaller), (count, tenant)]
        for round_ in range(ctx.repeats):
            for size, which in (tenants if round_ % 2 == 0 else tenants[::-1]):
                # Warmed up on a build of the same size: what each further build of a worker's costs, not
                # the allocator's first high-water mark (a one-off of 1-2 MiB at a million contacts).
                memory[size].append(partner_files.rss(url, work, partner.key_file, which, which, trace=round_ == 0))
            log(f"   partner files memory round {round_ + 1}: growth "
                f"{memory[small][-1].growth_kib / 1024:.1f} MiB at {small:,}, "
                f"{memory[count][-1].growth_kib / 1024:.1f} MiB at {count:,}")
    _rows(outcome, count, ours_text, theirs_text, runs, startups)
    _memory_rows(outcome, memory, small, count, ours_text.size)
    return outcome


def _check(ours: partner_files.Plaintext, theirs: partner_files.Plaintext, rows: int, count: int) -> None:
    if ours.header != partner_files.HEADER or theirs.header != partner_files.HEADER:
        raise RuntimeError(f"header lines {ours.header!r} (builder) and {theirs.header!r} (pipeline), "
                           f"not {partner_files.HEADER!r}")
    if ours.lines != rows + 1 or theirs.lines != ours.lines:
        raise RuntimeError(f"{ours.lines:,} lines decrypted from the builder's file ({rows:,} rows built), "
                           f"{theirs.lines:,} from the pipeline's")
    if ours.sha256 != theirs.sha256 or ours.size != theirs.size:
        raise RuntimeError("the builder's file decrypts to other bytes than the pipeline's: the comparison would "
                           "be unfair")
    if ours.cipher != theirs.cipher:
        raise RuntimeError(f"the builder's file is encrypted with {ours.cipher}, the pipeline's with {theirs.cipher}")
    if rows != count * 9 // 10:
        raise RuntimeError(f"{rows:,} rows built of {count:,} contacts, nine in ten consenting")


def _rows(outcome: Outcome, count: int, ours_text: partner_files.Plaintext, theirs_text: partner_files.Plaintext,
          runs: dict[str, list[partner_files.Run]], startups: list[float]) -> None:
    size = ours_text.size
    rate = lambda values: Stat.of([size / 2**20 / r.seconds for r in values])   # noqa: E731
    outcome.rows += [
        Row(f"builder, gzip + OpenPGP, {_label(count, size)}", "MiB/s", rate(runs["ours"]), rate(runs["pipeline"]),
            "psql \\copy | gzip -6 | gpg --encrypt of the same query", at_least(0.8)),
        Row(f"builder, gzip + OpenPGP, {_label(count, size)}", "s", Stat.of([r.seconds for r in runs["ours"]]),
            Stat.of([r.seconds for r in runs["pipeline"]]), "the same pipeline, wall seconds"),
        Row("psql start-up (start, connect, SELECT 1, exit)", "ms", Stat.of([s * 1000 for s in startups])),
    ]
    median = lambda values: statistics.median(values)   # noqa: E731
    outcome.tables["CPU seconds per file (medians of the rounds; the PostgreSQL backend's, the same COPY for "
                   "both, left out)"] = {
        "columns": ["", "builder", "pipeline"],
        "rows": [["wall", median([r.seconds for r in runs["ours"]]), median([r.seconds for r in runs["pipeline"]])],
                 ["Python (COPY read, zlib, the file read back and hashed)",
                  median([r.cpu_self for r in runs["ours"]]), "-"],
                 ["child processes (builder: gpg; pipeline: bash, psql, gzip, gpg)",
                  median([r.cpu_children for r in runs["ours"]]), median([r.cpu_children for r in runs["pipeline"]])],
                 ["all", median([r.cpu_self + r.cpu_children for r in runs["ours"]]),
                  median([r.cpu_children for r in runs["pipeline"]])]]}
    startup, pipe = statistics.median(startups), statistics.median(r.seconds for r in runs["pipeline"])
    outcome.notes += [
        f"Both files were decrypted with the partner's secret key and gunzipped before the rounds: "
        f"{ours_text.lines - 1:,} rows and a header line each, {size:,} bytes, the same SHA-256 "
        f"({ours_text.sha256[:16]}...), both encrypted with {ours_text.cipher} (gpg's choice from the key's "
        f"preferences). The encrypted files are {ours_text.file_size / 2**20:.2f} MiB (builder: zlib level "
        f"{partner_file.GZIP_LEVEL}) and {theirs_text.file_size / 2**20:.2f} MiB (GNU gzip -6).",
        f"psql's start-up ({startup * 1000:.0f} ms) is {100 * startup / pipe:.0f}% of the pipeline at this size and "
        "is left in, as gpg's is on both sides. The pipeline's three processes work side by side; the builder "
        "reads COPY and compresses in one Python thread, gpg in its own process.",
    ]


def _memory_rows(outcome: Outcome, memory: dict[int, list[partner_files.Memory]], small: int, count: int,
                 size: int) -> None:
    mib = lambda kib: kib / 1024   # noqa: E731
    for contacts in (small, count):
        runs = memory[contacts]
        outcome.rows.append(Row(f"builder process RSS, peak during the build, {contacts:,} contacts", "MiB",
                                Stat.of([mib(m.peak_kib) for m in runs]), Stat.of([mib(m.before_kib) for m in runs]),
                                "the same process before the build", versus="baseline"))
    # Not a ratio to the growth at the smaller size: that is near zero once a process is warm, and any
    # ratio to it says nothing. Flat means a few MiB whatever the file: a small fraction of it.
    outcome.rows.append(Row(f"builder process RSS growth during the build, {count:,} contacts", "MiB",
                            Stat.of([mib(m.growth_kib) for m in memory[count]]), Stat.of([size / 2**20]),
                            "the file's plaintext", at_most(1 / 16, "memory flat: <= 1/16 of the file"),
                            versus="baseline"))
    outcome.tables["Builder memory per build (medians of the rounds, MiB)"] = {
        "columns": ["contacts", "RSS before", "RSS peak (sampled)", "growth", "VmHWM since the warm-up",
                    "Python peak (tracemalloc)", "build seconds"],
        "rows": [[f"{contacts:,}", statistics.median(mib(m.before_kib) for m in memory[contacts]),
                  statistics.median(mib(m.peak_kib) for m in memory[contacts]),
                  statistics.median(mib(m.growth_kib) for m in memory[contacts]),
                  statistics.median(mib(m.hwm_kib) for m in memory[contacts]),
                  mib(memory[contacts][0].python_peak_kib), statistics.median(m.seconds for m in memory[contacts])]
                 for contacts in (small, count)]}
    outcome.notes.append(
        "Memory: each build in a process of its own (`python -m bench.partner_files --rss-child`), warmed up on "
        "a build of the same tenant; its VmRSS read from /proc every "
        f"{partner_files.SAMPLE_INTERVAL * 1000:.0f} ms from just before the build to its end; VmHWM is the "
        "kernel's peak, reset after the warm-up (clear_refs 5); the Python peak is a second build of the same "
        "tenant under tracemalloc in the first round. What RSS grows by beyond the Python peak is below Python "
        "(libpq's buffers, zlib's state, the C allocator's heap); a builder that held the file would grow by "
        "at least its encrypted size.")


WORKLOAD = Workload("11", "Partner files: gzip and OpenPGP", "A million contacts built into the partner's file "
                    "compressed and encrypted (default columns, gzip, one partner key, not signed) by "
                    "`ContactsBuilder.build`, against `psql \\copy ... | gzip -6 | gpg --encrypt` of the same query "
                    "(same level, same key and cipher), both decrypted and compared first; and the builder's "
                    "memory while it builds, at 100,000 and a million contacts.", run)
