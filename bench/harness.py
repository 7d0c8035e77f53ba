"""The harness: every workload against its ceiling, in one run, with medians and ranges.

A workload is a function ``run(ctx) -> Outcome``. It sets up its own fresh database
(``ctx.fresh_database``: migrated, seeded, ``VACUUM ANALYZE``, ``CHECKPOINT``), warms up, then uses
``ctx.paired`` to run its ceiling right before its own run at the same concurrency, three times,
alternating which goes first, so neither side gains from warm caches or loses to a checkpoint.
Each measured figure becomes a ``Row``: the median and range of ours, of the ceiling, their ratio, the
goal and whether it is met. ``python -m bench`` runs them all, writes ``bench/results/<date>.json``
and regenerates ``docs/benchmarks.md`` from it (``bench.report``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import _scratch

# --- figures -------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile; p in 0..100."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered))) - 1))]


@dataclass(frozen=True)
class Stat:
    """The median of some runs and their range."""

    median: float
    low: float
    high: float
    samples: tuple[float, ...] = ()

    @classmethod
    def of(cls, samples: list[float] | tuple[float, ...]) -> Stat:
        samples = tuple(float(s) for s in samples)
        return cls(statistics.median(samples), min(samples), max(samples), samples)


@dataclass(frozen=True)
class Goal:
    """``ratio >= x``, ``ratio <= x``, ``value <= x`` or ``value >= x``; text is what the table shows."""

    kind: str
    threshold: float
    text: str

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        subject = ratio if self.kind.startswith("ratio") else value
        if subject is None or subject != subject:   # NaN: not measured
            return None
        return subject >= self.threshold if self.kind.endswith("min") else subject <= self.threshold


def at_least(x: float, text: str | None = None) -> Goal:
    return Goal("ratio_min", x, text or f">= {x:g}x")


def at_most(x: float, text: str | None = None) -> Goal:
    return Goal("ratio_max", x, text or f"<= {x:g}x")


def value_at_most(x: float, text: str) -> Goal:
    return Goal("value_max", x, text)


def value_at_least(x: float, text: str) -> Goal:
    return Goal("value_min", x, text)


#: What a figure is compared with. A ceiling is the same work done with less (the same statement without
#: the system around it, the same files delivered with nothing but the transfer): ours cannot beat it, and
#: the ratio says how much of the limit ours reaches. A baseline is a reference ours is expected to match
#: or beat (a peer queue, an older approach, the same process idle): the ratio says by how much.
VERSUS = ("ceiling", "baseline")


@dataclass
class Row:
    """One figure of one workload, with what it is compared with (``ceiling``, named by
    ``ceiling_name``; ``versus`` says whether that is a ceiling or a baseline) and its goal."""

    metric: str
    unit: str
    ours: Stat
    ceiling: Stat | None = None
    ceiling_name: str = ""
    goal: Goal | None = None
    note: str = ""
    versus: str = "ceiling"

    def __post_init__(self) -> None:
        if self.versus not in VERSUS:
            raise ValueError(f"versus must be one of {VERSUS}, not {self.versus!r}")

    @property
    def ratio(self) -> float | None:
        if self.ceiling is None or not self.ceiling.median:
            return None
        return self.ours.median / self.ceiling.median

    @property
    def met(self) -> bool | None:
        return self.goal.met(self.ours.median, self.ratio) if self.goal else None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ratio=self.ratio, met=self.met)
        return data


@dataclass
class Outcome:
    """What one workload produced: its rows, notes for the reader, plain-text details (EXPLAIN
    output, settings) and time series for charts (``{title: {series: [(x, y), ...]}}``)."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    series: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    #: Tables of figures side by side (``{title: {"columns": [...], "rows": [[label, value, ...], ...]}}``).
    tables: dict[str, dict[str, list]] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    what: str
    run: Callable[[Context], Outcome]


# --- sizes -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between ``make bench`` (quick) and ``make bench-full`` (the issue's)."""

    name: str
    repeats: int
    e2e_seconds: float
    e2e_warmup_seconds: float
    e2e_idle_seconds: float
    e2e_contacts: int
    wakeup_idle_samples: int
    relay_rows: int
    relay_decay_seconds: float
    lease_attempts: int
    lease_renew_seconds: float
    scale_jobs: tuple[int, int]
    scale_due: int
    cancel_ops: int
    contended_ops: int
    claims_per_run: int
    peer_jobs: int
    #: Contacts of the large export (its builds, its upload and its run through the system).
    large_contacts: int
    stage_stop_runs: int
    stage_notify_creations: int


QUICK = Sizes(name="quick", repeats=3, e2e_seconds=10, e2e_warmup_seconds=3, e2e_idle_seconds=3, e2e_contacts=100,
              wakeup_idle_samples=8, relay_rows=8_000, relay_decay_seconds=0, lease_attempts=1000,
              lease_renew_seconds=4, scale_jobs=(10_000, 100_000), scale_due=500, cancel_ops=600, contended_ops=2_000,
              claims_per_run=600, peer_jobs=200, large_contacts=1_000_000, stage_stop_runs=8,
              stage_notify_creations=200)

FULL = Sizes(name="full", repeats=3, e2e_seconds=180, e2e_warmup_seconds=10, e2e_idle_seconds=10, e2e_contacts=100,
             wakeup_idle_samples=40, relay_rows=100_000, relay_decay_seconds=180, lease_attempts=1000,
             lease_renew_seconds=20, scale_jobs=(100_000, 1_000_000), scale_due=10_000, cancel_ops=3_000,
             contended_ops=10_000, claims_per_run=4_000, peer_jobs=2_000, large_contacts=1_000_000,
             stage_stop_runs=50, stage_notify_creations=1_000)


# --- the run's context -----------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Context:
    sizes: Sizes
    base_url: str
    broker_url: str
    work_dir: Path
    databases: list[str] = field(default_factory=list)
    #: What one workload leaves for a later one (the end-to-end run's wake-up latencies under load).
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def repeats(self) -> int:
        return self.sizes.repeats

    def fresh_database(self, name: str, seed: Callable[[str], None] | None = None) -> str:
        """A new migrated database ``exports_bench_<name>``, seeded as its owner, then settled."""
        full = f"exports_bench_{name}"
        url = _scratch.create(self.base_url, full)
        self.databases.append(full)
        if seed is not None:
            seed(url)
        settle(url)
        return url

    def drop_databases(self) -> None:
        for name in self.databases:
            try:
                _scratch.drop(self.base_url, name)
            except psycopg.Error as exc:
                log(f"could not drop {name}: {type(exc).__name__}")
        self.databases.clear()

    def paired(self, ceiling: Callable[[], float], ours: Callable[[], float], *,
               prepare: Callable[[], None] | None = None) -> tuple[list[float], list[float]]:
        """``repeats`` rounds; the ceiling goes first in even rounds, ours in odd ones. ``prepare``
        runs before every single run (reseed what the last one consumed, then settle)."""
        ceilings: list[float] = []
        ourselves: list[float] = []
        for round_ in range(self.repeats):
            order = ((ceiling, ceilings), (ours, ourselves))
            for run, into in (order if round_ % 2 == 0 else order[::-1]):
                if prepare is not None:
                    prepare()
                into.append(run())
        return ceilings, ourselves


def settle(url: str) -> None:
    """VACUUM ANALYZE and CHECKPOINT, so no run pays for the last one's dead tuples or dirty pages."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# --- running ---------------------------------------------------------------------------------------


@dataclass
class WorkloadReport:
    key: str
    title: str
    what: str
    seconds: float
    outcome: Outcome
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "what": self.what, "seconds": round(self.seconds, 1),
                "error": self.error, "rows": [r.as_json() for r in self.outcome.rows], "notes": self.outcome.notes,
                "details": self.outcome.details, "series": self.outcome.series, "tables": self.outcome.tables}


def run_all(ctx: Context, workloads: list[Workload], *, profile_dir: Path | None = None) -> list[WorkloadReport]:
    """Runs each workload; one that fails is reported with its error and the run goes on. With
    ``profile_dir``, each runs under pyinstrument and its profile is written there as text."""
    reports = []
    for workload in workloads:
        log(f"== {workload.key} {workload.title}")
        started = time.perf_counter()
        error = None
        try:
            if profile_dir is None:
                outcome = workload.run(ctx)
            else:
                outcome = _profiled(workload, ctx, profile_dir)
        except Exception as exc:   # a broken workload must not cost the others' figures
            error = f"{type(exc).__name__}: {exc}"
            log(f"   failed: {error}\n{traceback.format_exc()}")
            outcome = Outcome()
        finally:
            ctx.drop_databases()
        elapsed = time.perf_counter() - started
        log(f"   {workload.key} done in {elapsed:.0f} s")
        reports.append(WorkloadReport(workload.key, workload.title, workload.what, elapsed, outcome, error))
    return reports


def _profiled(workload: Workload, ctx: Context, profile_dir: Path) -> Outcome:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        return workload.run(ctx)
    finally:
        profiler.stop()
        profile_dir.mkdir(parents=True, exist_ok=True)
        path = profile_dir / f"workload-{workload.key}.txt"
        path.write_text(profiler.output_text(unicode=False, color=False, show_all=False), encoding="utf-8")
        log(f"   profile: {path}")


def machine() -> dict[str, Any]:
    import platform
    import subprocess

    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = None
    try:
        with psycopg.connect(_scratch.base_url(), autocommit=True) as conn:
            info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
    except psycopg.Error:
        info["postgresql"] = None
    return info
