"""The benchmark harness itself, with no database: pairing, rows, goals and the page it renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import harness, pgbench, report


def _context(tmp_path: Path, repeats: int = 3) -> harness.Context:
    sizes = harness.QUICK.__class__(**{**harness.QUICK.__dict__, "repeats": repeats})
    return harness.Context(sizes=sizes, base_url="postgresql://unused", broker_url="redis://unused", work_dir=tmp_path)


def test_paired_runs_alternate_which_side_goes_first_and_prepare_each_run(tmp_path):
    ctx = _context(tmp_path)
    calls: list[str] = []
    ceilings, ours = ctx.paired(lambda: calls.append("ceiling") or 10.0, lambda: calls.append("ours") or 5.0,
                                prepare=lambda: calls.append("prepare"))
    runs = [c for c in calls if c != "prepare"]
    assert runs == ["ceiling", "ours", "ours", "ceiling", "ceiling", "ours"]
    assert calls.count("prepare") == 6
    assert ceilings == [10.0] * 3 and ours == [5.0] * 3


def test_a_row_has_the_median_and_range_of_its_runs_its_ratio_and_whether_its_goal_is_met():
    row = harness.Row("jobs", "jobs/s", harness.Stat.of([3.0, 1.0, 2.0]), harness.Stat.of([4.0, 4.0, 4.0]),
                      "pgbench", harness.at_least(0.5))
    assert (row.ours.median, row.ours.low, row.ours.high) == (2.0, 1.0, 3.0)
    assert row.ratio == 0.5
    assert row.met is True
    too_slow = harness.Row("latency", "ms", harness.Stat.of([80.0]), goal=harness.value_at_most(50, "p99 <= 50 ms"))
    assert too_slow.met is False
    assert harness.Row("no ceiling", "x", harness.Stat.of([1.0])).met is None


def test_a_fake_workload_produces_a_result_row_and_the_page_renders_its_table(tmp_path):
    fake = harness.Workload("F", "Fake", "A workload that measures nothing.", lambda ctx: harness.Outcome(
        rows=[harness.Row("widgets", "widgets/s", harness.Stat.of([9.0, 10.0, 11.0]), harness.Stat.of([20.0]),
                          "a faster widget", harness.at_least(0.3))],
        notes=["made up"], details={"EXPLAIN x": "Index Scan using ix_x"}))
    broken = harness.Workload("B", "Broken", "Raises.", lambda ctx: 1 / 0)
    reports = harness.run_all(_context(tmp_path), [fake, broken])
    assert reports[1].error == "ZeroDivisionError: division by zero"
    results = {"file": "2026-01-01.json", "mode": "quick", "started": "2026-01-01 00:00 UTC", "total_seconds": 1.0,
               "machine": {"cpus": 2}, "workloads": [r.as_json() for r in reports]}
    page = report.render(results, {})

    assert "| widgets | widgets/s | 10 (9-11) | ceiling: a faster widget | 20 | 0.500 | >= 0.3x | yes |" in page
    assert "## F. Fake" in page and "- made up" in page and "Index Scan using ix_x" in page
    assert "**Not measured in this run:** `ZeroDivisionError: division by zero`" in page


def test_pgbench_scripts_are_the_store_statement_with_its_parameters_translated():
    line = pgbench.statement("export_lease_renew", {"job_id": "md5('j' || :i)::uuid"})
    assert "/* export_lease_renew */" in line and "\n" not in line and line.endswith(";")
    assert "id = md5('j' || :i)::uuid" in line
    assert ":attempt_id" in line and ":lease_seconds" in line and "%(" not in line


def test_the_page_says_whether_each_comparison_is_a_ceiling_or_a_baseline_and_flags_a_ceiling_ours_beats():
    rows = [harness.Row("exports", "exports/s", harness.Stat.of([60.0]), harness.Stat.of([50.0]), "a peer queue",
                        harness.at_least(1.2), versus="baseline"),
            harness.Row("builder", "MiB/s", harness.Stat.of([60.0]), harness.Stat.of([50.0]), "psql \\copy",
                        harness.at_least(0.9)),
            harness.Row("upload", "MiB/s", harness.Stat.of([40.0]), harness.Stat.of([50.0]), "sftp",
                        harness.at_least(0.6)),
            harness.Row("upload", "MiB/s", harness.Stat.of([40.0]), harness.Stat.of([30.0]), "paramiko alone"),
            harness.Row("latency", "ms", harness.Stat.of([40.0]), harness.Stat.of([30.0]), "a round trip")]
    lines = report.table([r.as_json() for r in rows])

    assert "| baseline: a peer queue | 50 | 1.20 | >= 1.2x | yes |" in lines[2]
    assert "ceiling: psql \\copy (**ours beats it: not a limit**)" in lines[3]
    assert "| ceiling: sftp | 50 | 0.800 | >= 0.6x | yes |" in lines[4]
    assert "ceiling: paramiko alone (**ours beats it: not a limit**)" in lines[5]   # a rate: higher is better
    assert "| ceiling: a round trip | 30 | 1.33 | - | - |" in lines[6]   # a cost above its ceiling is expected


def test_a_comparison_is_either_a_ceiling_or_a_baseline():
    with pytest.raises(ValueError, match="versus"):
        harness.Row("x", "x/s", harness.Stat.of([1.0]), versus="peer")


def test_a_side_by_side_table_renders_a_column_per_side_with_the_numbers_rounded():
    spec = {"columns": ["per export", "least work", "ours"],
            "rows": [["exports/s", 375.4, 56.52], ["SSH logins", 0.0, float("nan")]]}
    lines = report.side_by_side("Per export", spec)
    assert lines[0] == "**Per export**"
    assert lines[2] == "| per export | least work | ours |"
    assert lines[4] == "| exports/s | 375 | 56.5 |"
    assert lines[5] == "| SSH logins | 0 | - |"
