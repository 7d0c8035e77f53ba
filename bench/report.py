"""docs/benchmarks.md and its charts, regenerated from one results file.

    python -m bench.report bench/results/2026-12-01.json

Charts need matplotlib (the ``bench`` extra); without it the page is written with a note instead.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
CHARTS = ROOT / "docs" / "benchmarks"


def _number(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    magnitude = abs(value)
    if value == int(value) and magnitude < 1e6:
        return f"{int(value):,}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _stat(stat: dict[str, Any] | None) -> str:
    if not stat:
        return "-"
    if len(stat.get("samples") or ()) > 1 and stat["low"] != stat["high"]:
        return f"{_number(stat['median'])} ({_number(stat['low'])}-{_number(stat['high'])})"
    return _number(stat["median"])


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[met]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def compared_with(row: dict[str, Any]) -> str:
    """The comparison's name, said to be a ceiling or a baseline; a ceiling ours beats is flagged, since a
    limit cannot be beaten: it is a baseline, or the measurement is wrong."""
    name = row.get("ceiling_name")
    if not name:
        return "-"
    versus = row.get("versus", "ceiling")
    text = f"{versus}: {name}"
    ratio = row.get("ratio")
    goal = row.get("goal") or {}
    # Higher is better for a rate, or where the goal says so.
    higher_better = goal.get("kind") == "ratio_min" or (not goal and row.get("unit", "").endswith("/s"))
    if versus == "ceiling" and higher_better and ratio is not None and ratio > 1.05:
        text += " (**ours beats it: not a limit**)"
    return text


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| figure | unit | ours, median (range) | compared with | its median (range) | ratio | goal | met |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        goal = row["goal"]["text"] if row.get("goal") else "-"
        lines.append(f"| {row['metric']} | {row['unit']} | {_stat(row['ours'])} | {compared_with(row)} "
                     f"| {_stat(row.get('ceiling'))} | {_number(row.get('ratio'))} | {goal} | {_met(row.get('met'))} |")
        if row.get("note"):
            lines.append(f"| ↳ {row['note']} | | | | | | | |")
    return lines


def side_by_side(title: str, spec: dict[str, list]) -> list[str]:
    """A table of figures side by side (``Outcome.tables``): a label column, then one column each."""
    columns = spec["columns"]
    lines = [f"**{title}**", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for label, *values in spec["rows"]:
        cells = [v if isinstance(v, str) else _number(v) for v in values]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return lines


def charts(results: dict[str, Any], out: Path) -> dict[str, list[str]]:
    """PNG files per workload key (``summary`` for the ratio chart); empty without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    made: dict[str, list[str]] = {}

    labelled = [(f"{w['key']} {r['metric']}", r["ratio"], r.get("goal")) for w in results["workloads"]
                for r in w["rows"] if r.get("ratio") is not None and r.get("goal")
                and r["goal"]["kind"].startswith("ratio")]
    if labelled:
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(labelled) + 1.2))
        names = [name[:70] for name, _, _ in labelled][::-1]
        ratios = [ratio for _, ratio, _ in labelled][::-1]
        goals = [goal["threshold"] for _, _, goal in labelled][::-1]
        colours = ["tab:green" if (r >= g if goal["kind"] == "ratio_min" else r <= g) else "tab:red"
                   for (_, _, goal), r, g in zip(labelled[::-1], ratios, goals, strict=True)]
        ax.barh(names, ratios, color=colours)
        ax.scatter(goals, names, marker="|", s=250, color="black", label="goal", zorder=3)
        ax.set_xscale("log")
        ax.set_xlabel("ours / ceiling (log scale); green: goal met")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "ratios.png", dpi=90)
        plt.close(fig)
        made["summary"] = ["ratios.png"]

    for workload in results["workloads"]:
        for title, series in (workload.get("series") or {}).items():
            fig, ax = plt.subplots(figsize=(8, 3.2))
            for name, points in series.items():
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, label=name, marker="." if len(points) < 60 else None)
            ax.set_title(f"{workload['key']} {title}")
            ax.set_xlabel(title.split(" vs ")[-1] if " vs " in title else "seconds")
            ax.legend(fontsize="small")
            ax.grid(alpha=0.3)
            fig.tight_layout()
            name = f"{workload['key']}-{slug(title)}.png"
            fig.savefig(out / name, dpi=90)
            plt.close(fig)
            made.setdefault(workload["key"], []).append(name)
    return made


def render(results: dict[str, Any], made: dict[str, list[str]]) -> str:
    meta = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench` from "
        f"`bench/results/{results['file']}`; do not edit by hand (`make bench` regenerates it).",
        "",
        f"- run: **{results['mode']}** mode ({'`make bench`' if results['mode'] == 'quick' else '`make bench-full`'}), "
        f"{results['started']}, {results['total_seconds']:.0f} s in all",
        f"- machine: {meta.get('cpus')} cores, PostgreSQL {meta.get('postgresql')}, Python {meta.get('python')}, "
        f"commit {meta.get('commit')}",
        "- every figure is the median of the runs, with their range; what it is compared with ran in the same "
        "run, right before or after ours at the same concurrency, the order alternating between rounds. Only a "
        "run on an idle machine gives final figures: CPU, WAL and the PostgreSQL server's counters are "
        "machine- or server-wide, and a busy neighbour inflates them.",
        "- `ratio` is ours / what it is compared with (for latencies and costs, lower is better; the goal column "
        "says which way). Each comparison is a **ceiling** or a **baseline**. A ceiling is the same work done "
        "with less: the same statement without the system around it, the same files delivered with nothing but "
        "the transfer; ours cannot beat it, and the ratio says how close ours comes to the limit. A baseline is a "
        "reference ours is expected to match or beat: a peer queue running the same export body, the same "
        "process idle; the ratio says by how much. A ceiling that ours beats is flagged: it is not a limit.",
        "",
    ]
    if "summary" in made:
        lines += ["![ratios](benchmarks/ratios.png)", ""]
    lines += ["## Summary", ""]
    summary = [dict(r, metric=f"{w['key']} · {r['metric']}") for w in results["workloads"] for r in w["rows"]
               if r.get("goal")]
    lines += table(summary) + [""]
    for workload in results["workloads"]:
        lines += [f"## {workload['key']}. {workload['title']}", "", workload["what"], ""]
        if workload.get("error"):
            lines += [f"**Not measured in this run:** `{workload['error']}`", ""]
        if workload["rows"]:
            lines += table(workload["rows"]) + [""]
        for title, spec in (workload.get("tables") or {}).items():
            lines += side_by_side(title, spec) + [""]
        for note in workload.get("notes") or []:
            lines.append(f"- {note}")
        if workload.get("notes"):
            lines.append("")
        for name in made.get(workload["key"], []):
            lines += [f"![{name}](benchmarks/{name})", ""]
        for title, text in (workload.get("details") or {}).items():
            lines += [f"<details><summary>{title}</summary>", "", "```", text.rstrip(), "```", "", "</details>", ""]
        lines.append(f"_{workload['seconds']:.0f} s_")
        lines.append("")
    if not made:
        lines += ["_Charts were not drawn: matplotlib is missing (`pip install -e '.[bench]'`)._", ""]
    lines += COUNTED + RUNNING
    return "\n".join(lines)


#: Counts, not timings: written from runs of ``python -m bench.counted`` (issue 16), kept by hand here
#: because that command is not a workload of this run; a change that moves one updates its row.
COUNTED = [
    "## Counted costs",
    "",
    "What an export and an idle second cost in things that load does not change, before and after the cuts "
    "of issue 16: `python -m bench.counted` (the system of workload 1 on a scratch database, a private "
    "redis-server and the partner: 100 exports of 100 contacts one at a time, then a burst of 200; "
    "`--exports`, `--burst`, `--idle-seconds`). Before: main at 9f7b3d5; after: branch perf; alternating runs "
    "on this machine (4 before, 2 after), medians with their range. Transactions are the scratch "
    "database's in `pg_stat_database`, less the bench's own creations and polls and the idle rate over the "
    "window (each reading waits out PostgreSQL's 10 s stats flush); Redis commands are `INFO commandstats`, "
    "idle polling included; log lines are INFO lines naming the export.",
    "",
    "| what | before | after | where the cut is, and what pins it |",
    "|---|---|---|---|",
    "| idle system (relay, 2 workers, scheduler): Redis commands/s | 302 (298-315) | 2.4 (2.4-2.4) | "
    "an idle consumer waits on its queue's wake-up channel instead of running Dramatiq's fetch script every "
    "50 ms; fetches every 5 s anyway (`app/broker.py`; tests/integration/test_broker_wakeup.py) |",
    "| one at a time: Redis commands per export | 84 (75-85) | 18.4 (18.4-18.4) | the same; per export now: "
    "the relay's enqueue and one wake-up per batch, a woken fetch per idle worker process, the ack |",
    "| burst of 200: Redis commands per export | 31 (30-33) | 13.4 (13.4-13.5) | the same |",
    "| commit -> Claimed, idle, p50 / p99 (workload 2, 8 samples, loaded machine) | 20 / 35 ms | 21 / 30 ms | "
    "the wake-up keeps the latency the 50 ms poll bought |",
    "| relay: transactions per wake-up | 3 | 1 | a short batch ends the drain, and the claim says when the "
    "next row falls due (`relay_claim_batch`; test_a_drain_of_one_short_batch_costs_one_transaction...) |",
    "| worker: statements / transactions per export on the runner's thread | 5 / 5 | 5 / 5 | already the "
    "reference's minimum: job read, claim, COPY, cutoff 2 with the baseline, terminal write with the "
    "evidence; three write (tests/integration/actors/test_runner_costs.py pins the list) |",
    "| worker: stop-watcher queries per export | 1-2 | 0 | a new watch is checked against the row only if "
    "its job was notified before it was watched (`app/actors/watcher.py`) |",
    "| one at a time: transactions per export (creation excluded) | 10.4 (9.8-10.6) | 7.1 (7.0-7.2) | the "
    "relay's and the watcher's |",
    "| burst of 200: transactions per export (creation excluded) | 8.1 (7.7-8.3) | 5.7 (5.7-5.8) | the same |",
    "| INFO log lines per export | 7 | 5 | `delivery.baseline` (no file there) and `delivery.finished` at "
    "DEBUG: `runner.delivered` says the outcome; left: `relay.enqueued`, `runner.claimed`, "
    "`runner.authorized`, `runner.delivered`, `export.processed` |",
    "| host key parses per delivery | 1 (150 us an RSA key) | 0 | parsed once per process per "
    "known_hosts line (`parse_host_key`) |",
    "",
]

RUNNING = [
    "## Running it",
    "",
    "- `make bench`: every workload at quick sizes (under 10 minutes on 2 cores); `make bench-full`: the "
    "sizes and durations of issue 11 (3-minute end-to-end and relay drains, 100k/1M jobs, 10k mixed "
    "operations). Both install the `bench` extra (matplotlib, Procrastinate, pgqueuer, pyinstrument, py-spy), "
    "write `bench/results/<date>.json` and regenerate this page; `BENCH_ARGS` passes options through.",
    "- `python -m bench --only 3,5 --repeats 1`: some workloads; `--results FILE`: a trial run that leaves "
    "the day's results file alone; `--profile DIR`: each under pyinstrument, its profile written to DIR; "
    "`python -m bench.report bench/results/<date>.json`: this page again from a results file.",
    "- Needs PostgreSQL (`EXPORTS_BENCH_DATABASE_URL`, default `postgresql://postgres@127.0.0.1:5432/postgres`; "
    "scratch databases `exports_bench_*` are created and dropped), pgbench (Debian `postgresql-contrib`), "
    "`redis-server` (the run starts its own on a free loopback port; `EXPORTS_BENCH_BROKER_URL` picks another), "
    "and for the SFTP partner, the end-to-end ceilings and the upload stage, root and OpenSSH sshd and its "
    "`sftp` client (else the embedded partner server, and none of those). Final figures come from an idle "
    "machine: CPU, WAL and the PostgreSQL server's figures are machine- or server-wide.",
    "- Each module of the first benchmarks still runs alone: `python -m bench.claim_throughput`, "
    "`bench.notify_cost`, `bench.stop_latency`, `bench.build_export`, `bench.upload_throughput`, "
    "`bench.warm_sessions`; and `python -m bench.counted`, the counted costs above.",
    "- Three run only alone, their figures kept by hand in [benchmarks-standalone.md](benchmarks-standalone.md): "
    "`python -m bench.partner_files` (a partner file with gzip and OpenPGP against `psql \\copy | gzip | gpg`), "
    "`python -m bench.webhook_cost`, and `python -m bench.floor_stripped` (whether the end-to-end goal fits "
    "inside the protocol: Procrastinate, the protocol floor, and the floor on a schema without its per-row "
    "costs).",
    "",
]


def write(results: dict[str, Any], docs: Path = DOCS, chart_dir: Path = CHARTS) -> Path:
    made = charts(results, chart_dir)
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(render(results, made) + "\n", encoding="utf-8")
    return docs


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m bench.report bench/results/<date>.json", file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 1
    print(write(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
