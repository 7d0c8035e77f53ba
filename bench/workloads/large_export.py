"""Part of workload 9: one large export (a million contacts, about 59 MiB), stage by stage against the
limits of each stage, and through the running system against the sum of those limits.

- Build: the builder against psql's ``\\copy`` of the same query (its start-up timed apart: negligible
  at this size), server-side ``COPY ... TO`` a file and a bare psycopg ``COPY TO STDOUT`` loop
  (``bench.build_export``).
- Upload of that file: ``Destination.deliver`` on a warm session against OpenSSH ``sftp -b`` with its
  handshake left out and paramiko's cipher and MAC forced, and against paramiko alone on a warm
  session (``bench.upload_throughput``).
- The export, create -> Completed through the real relay, workers and scheduler, against psql's
  ``\\copy`` plus sftp's transfer of the same round; and the peak RSS of the worker processes while it
  runs against the same processes idle.

Every round runs the stages with the system stopped and the export with it running, the order of the
two phases and of the contenders within a phase alternating between rounds. Needs root and OpenSSH sshd
for all but the builds.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from pathlib import Path

import psycopg

from app.actors.builder import ContactsBuilder
from app.delivery.config import DestinationConfig
from app.store.database import connect
from app.store.types import Role
from bench import build_export, meter, procstat, system, upload_throughput
from bench.harness import Context, Outcome, Row, Stat, at_least, at_most, log, settle
from bench.workloads.wakeup import TERMINAL, latencies

WORKERS = 2
THREADS = 2
#: Seconds between RSS samples (and status polls) while the large export runs.
SAMPLE_INTERVAL = 0.01
EXPORT_TIMEOUT = 300.0
#: Warm-up exports at most, until each worker process has delivered one (which one takes it is the broker's).
WARM_UP_EXPORTS = 12


class LargeSystem:
    """The running system for the large export, started on first use, stopped while the stages run."""

    def __init__(self, url: str, broker_url: str, state: Path, tenant: uuid.UUID, destination: uuid.UUID) -> None:
        self.url, self.broker_url, self.state = url, broker_url, state
        self.tenant, self.destination = tenant, destination
        self.procs: system.Processes | None = None
        self.starts = 0

    def up(self) -> None:
        if self.procs is not None:
            return
        system.flush_broker(self.broker_url)
        self.procs = system.Processes.for_database(self.url, self.broker_url, self.state / f"start-{self.starts}")
        self.procs.start_system(WORKERS, THREADS)
        self.starts += 1
        self._warm_up()

    def _warm_up(self) -> None:
        """Exports until every worker process has delivered one: imports, pools, and a warm session in each
        process. One warm-up export warms only the process that took it; the measured export then landed
        on the other one about half the time and logged in first (1.01 s with one SSH login, 0.62 s with
        none), measuring the handshake the ceiling leaves out."""
        assert self.procs is not None
        for _ in range(WARM_UP_EXPORTS):
            self.export_once()
            delivered_by = {line.split()[1] for line in self.procs.log_text("worker").splitlines()
                            if " runner.delivered " in line}
            if len(delivered_by) >= WORKERS:
                return
        raise RuntimeError(f"{WARM_UP_EXPORTS} warm-up exports did not reach all {WORKERS} worker processes")

    def down(self) -> None:
        if self.procs is not None:
            self.procs.stop()
            self.procs = None

    def export_once(self) -> dict:
        """One export, create -> Completed, on the database's clock; the worker processes' RSS sampled
        before it (idle) and while it runs (peak)."""
        assert self.procs is not None
        workers = sorted(procstat.tree(procstat.read_all(), self.procs.pids("worker")))
        idle = {pid: procstat.rss_kib(pid) or 0 for pid in workers}
        peak = dict(idle)
        with contextlib.closing(connect(self.url, Role.APP)) as conn, \
                psycopg.connect(self.url, autocommit=True) as reader:
            job_id = system.create_export(conn, self.tenant, self.destination)
            deadline = time.monotonic() + EXPORT_TIMEOUT
            while True:
                for pid in workers:
                    peak[pid] = max(peak[pid], procstat.rss_kib(pid) or 0)
                row = reader.execute("SELECT status FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
                if row is not None and row[0] in TERMINAL:
                    status = row[0]
                    break
                self.procs.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the large export did not end within {EXPORT_TIMEOUT:.0f} s")
                time.sleep(SAMPLE_INTERVAL)   # a sampling interval
        if status != "Completed":
            raise RuntimeError(f"the large export ended {status}")
        _, finished = latencies(self.url, [job_id])
        grown = max(workers, key=lambda pid: peak[pid] - idle[pid])
        return {"seconds": finished[0], "idle_kib": idle[grown], "peak_kib": peak[grown],
                "largest_kib": max(peak.values())}


def _empty(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            path.unlink()


class Uploads:
    """The upload contenders on one partner, each with its warm session."""

    def __init__(self, access: system.PartnerAccess, local: Path, size: int, sha256: bytes, work: Path) -> None:
        assert access.key_file is not None
        self.access, self.local, self.size, self.sha256, self.work = access, local, size, sha256, work
        self.key_file = access.key_file
        self.config = DestinationConfig(host=access.host, port=access.port, username=access.username,
                                        remote_dir=access.remote_dir, host_key=access.host_key,
                                        credential_ref=access.credential_ref)
        self.cipher, self.mac = upload_throughput.negotiated(self.config, {})
        self.delivery = upload_throughput.WarmDelivery(self.config, {})
        self.bare = upload_throughput.WarmParamiko(self.config, {})
        self.negotiated = ""
        self.seconds: dict[str, list[float]] = {"ours": [], "sftp": [], "paramiko": [], "handshake": [],
                                                "sftp_total": []}
        self.delivery.deliver(local, size, sha256)   # warm-up: the pool's session
        _empty(access.inbox)

    def _sftp(self) -> None:
        run_, _ = upload_throughput.sftp_put(self.config, self.key_file, self.local, self.work, cipher=self.cipher,
                                             mac=self.mac)
        self.seconds["sftp"].append(run_.after_handshake)
        self.seconds["sftp_total"].append(run_.total)
        self.negotiated = run_.negotiated

    def _handshake(self) -> None:
        self.seconds["handshake"].append(upload_throughput.sftp_handshake(
            self.config, self.key_file, self.work, cipher=self.cipher, mac=self.mac).total)

    def phase(self, forward: bool) -> None:
        steps = [self._handshake, self._sftp,
                 lambda: self.seconds["paramiko"].append(self.bare.put(self.local)[0]),
                 lambda: self.seconds["ours"].append(self.delivery.deliver(self.local, self.size, self.sha256)[0])]
        for step in (steps if forward else steps[::-1]):
            step()
            _empty(self.access.inbox)

    def close(self) -> None:
        self.delivery.close()
        self.bare.close()


def run(ctx: Context, outcome: Outcome) -> None:
    count = ctx.sizes.large_contacts
    state = ctx.work_dir / "large"
    with system.partner(state / "partner") as access, build_export.server_directory() as served:
        url = ctx.fresh_database("large")
        with psycopg.connect(url, autocommit=True) as owner:
            tenant = build_export.seed(owner, count)
        settle(url)
        work = state / "work"
        work.mkdir(parents=True, exist_ok=True)
        builder = ContactsBuilder(url, work)
        _, size, _, sha = build_export.build(builder, tenant)   # warm-up
        local = work / "export.csv"
        build_export.psql_copy(url, local, tenant)
        if build_export.sha256_of(local) != sha:
            raise RuntimeError("psql's \\copy wrote other bytes than the builder: the comparison would be unfair")
        builds: dict[str, list[float]] = {"ours": [], "psql": [], "server": [], "loop": [], "startup": []}
        steps = [("psql", lambda: build_export.psql_copy(url, work / "psql.csv", tenant)),
                 ("server", lambda: build_export.server_copy(url, served / "server.csv", tenant)),
                 ("loop", lambda: build_export.psycopg_loop(url, work / "loop.csv", tenant)),
                 ("startup", lambda: build_export.psql_startup(url)),
                 ("ours", lambda: build_export.build(builder, tenant)[0])]
        try:
            build_export.server_copy(url, served / "server.csv", tenant)
        except psycopg.Error as exc:
            outcome.notes.append(f"Server-side COPY to a file was not measured: {type(exc).__name__}: {exc}")
            steps = [step for step in steps if step[0] != "server"]
        uploads = large = None
        if access.openssh:
            uploads = Uploads(access, local, size, sha, work)
            large = LargeSystem(url, ctx.broker_url, state, tenant, system.add_destination(url, access, tenant))
        exports: list[dict] = []
        sums: list[float] = []
        try:
            for round_ in range(ctx.repeats):
                forward = round_ % 2 == 0
                for phase in (("stages", "system") if forward else ("system", "stages")):
                    if phase == "stages":
                        if large is not None:
                            large.down()
                        for name, step in (steps if forward else steps[::-1]):
                            builds[name].append(step())
                        if uploads is not None:
                            uploads.phase(forward)
                    elif large is not None:
                        large.up()
                        before = meter.count_logins(access.log.read_text()) if access.log else 0
                        exports.append(large.export_once())
                        exports[-1]["logins"] = (meter.count_logins(access.log.read_text()) - before
                                                 if access.log else float("nan"))
                        _empty(access.inbox)
                if uploads is not None:
                    sums.append(builds["psql"][-1] + uploads.seconds["sftp"][-1])
                log(f"   large round {round_ + 1}: builder {builds['ours'][-1]:.2f} s, psql {builds['psql'][-1]:.2f} s"
                    + (f", deliver {uploads.seconds['ours'][-1]:.2f} s, sftp {uploads.seconds['sftp'][-1]:.2f} s, "
                       f"export {exports[-1]['seconds']:.2f} s" if uploads is not None else ""))
        finally:
            if large is not None:
                large.down()
            if uploads is not None:
                uploads.close()
        peak_python = build_export.build(builder, tenant, trace=True)[2]
        builder.close()
    _rows(outcome, count, size, builds, peak_python)
    if uploads is not None and large is not None:
        _upload_rows(outcome, size, uploads)
        _export_rows(outcome, count, size, exports, sums, large.starts)
    else:
        outcome.notes.append("The large upload and the large export were not measured: they need root and OpenSSH "
                             "sshd (and its sftp client).")


def _label(count: int, size: int) -> str:
    return f"{count:,} contacts ({size / 2**20:.0f} MiB)"


def _rate(size: int, seconds: list[float]) -> Stat:
    return Stat.of([size / 2**20 / s for s in seconds])


def _rows(outcome: Outcome, count: int, size: int, builds: dict[str, list[float]], peak_python: int) -> None:
    label = _label(count, size)
    ours = _rate(size, builds["ours"])
    outcome.rows.append(Row(f"builder, {label}", "MiB/s", ours, _rate(size, builds["psql"]),
                            "psql \\copy of the same query, same options", at_least(0.9)))
    if builds["server"]:
        outcome.rows.append(Row(f"builder, {label}", "MiB/s", ours, _rate(size, builds["server"]),
                                "server-side COPY TO a file (no client, no socket)"))
    outcome.rows += [
        Row(f"builder, {label}", "MiB/s", ours, _rate(size, builds["loop"]),
            "COPY TO STDOUT read by a bare psycopg loop (no hash, no fsync)"),
        Row("psql start-up (start, connect, SELECT 1, exit)", "ms", Stat.of([s * 1000 for s in builds["startup"]])),
        Row(f"builder peak Python memory, {label}", "KiB", Stat.of([peak_python / 1024])),
    ]
    startup, psql = statistics.median(builds["startup"]), statistics.median(builds["psql"])
    outcome.notes.append(f"psql's start-up ({startup * 1000:.0f} ms) is {100 * startup / psql:.0f}% of its \\copy at "
                         "this size and is left in (at a few thousand contacts it was most of the figure). The builder "
                         "also hashes (SHA-256) and fsyncs its file; psql and the bare loop do neither.")


def _upload_rows(outcome: Outcome, size: int, uploads: Uploads) -> None:
    seconds = uploads.seconds
    ours = _rate(size, seconds["ours"])
    outcome.rows += [
        Row("upload of that file, Destination.deliver on a warm session", "MiB/s", ours, _rate(size, seconds["sftp"]),
            "OpenSSH sftp -b, same cipher and MAC, handshake left out", at_least(0.6)),
        Row("upload of that file, Destination.deliver on a warm session", "MiB/s", ours,
            _rate(size, seconds["paramiko"]), "paramiko writing the file on a warm session, nothing else"),
        Row("sftp -b with an empty batch (handshake and exit)", "s", Stat.of(seconds["handshake"])),
    ]
    outcome.notes.append(
        f"Cipher and MAC: paramiko negotiates {uploads.cipher} + {uploads.mac} with OpenSSH; sftp was given them "
        f"(-c, -o MACs) and negotiated '{uploads.negotiated}'. sftp's transfer is timed from its 'Sending subsystem: "
        "sftp' line (-v, stamped as it arrives: key exchange and authentication are done) to its exit; the whole "
        f"command took {statistics.median(seconds['sftp_total']):.2f} s (median), an empty batch "
        f"{statistics.median(seconds['handshake']):.2f} s.")


def _export_rows(outcome: Outcome, count: int, size: int, exports: list[dict], sums: list[float], starts: int) -> None:
    outcome.rows += [
        Row(f"export of {_label(count, size)}, create -> Completed through the system", "s",
            Stat.of([e["seconds"] for e in exports]), Stat.of(sums), "psql \\copy + sftp transfer of the same round",
            at_most(1 / 0.9, "<= 1.11x (>= 0.9x the speed)")),
        Row("worker process RSS, peak during the large export", "MiB",
            Stat.of([e["peak_kib"] / 1024 for e in exports]), Stat.of([e["idle_kib"] / 1024 for e in exports]),
            "the same process idle, after an export", versus="baseline"),
        # Flat: what the worker holds does not grow with the file; one that held the file would grow by its size.
        Row("worker process RSS growth during the large export", "MiB",
            Stat.of([(e["peak_kib"] - e["idle_kib"]) / 1024 for e in exports]), Stat.of([size / 2**20]),
            "the file's size", at_most(0.25, "memory flat: <= 1/4 of the file"), versus="baseline"),
        Row("SSH logins during each measured large export", "logins", Stat.of([e["logins"] for e in exports])),
    ]
    outcome.notes.append(
        f"The large export: {WORKERS} `exports worker --processes 1 --threads {THREADS}`, the relay and the "
        f"scheduler, started {starts} times (stopped while the stages ran), each start followed by an unmeasured "
        "export; its time is on the database's clock (the outbox row's created_at to the Finished event). RSS: "
        f"VmRSS of every worker process (/proc/<pid>/status) every {SAMPLE_INTERVAL * 1000:.0f} ms; the row is the "
        f"process that grew most; the largest peak of any was {max(e['largest_kib'] for e in exports) / 1024:.0f} MiB.")
