"""Reading process trees' CPU and memory from /proc, against a /proc written for each test."""

from __future__ import annotations

from pathlib import Path

from bench import procstat


def _stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    # The fields of proc(5) from state (3) to cstime (17); the ones a counter ignores are zeros.
    middle = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime), str(cutime), str(cstime)]
    return f"{pid} ({comm}) " + " ".join(middle + ["20", "0", "1", "0", "12345"]) + "\n"


def _proc(root: Path, processes: dict[int, tuple[str, int, int, int, int, int]],
          cmdlines: dict[int, bytes] | None = None) -> Path:
    for pid, (comm, ppid, utime, stime, cutime, cstime) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        (directory / "stat").write_text(_stat_line(pid, comm, ppid, utime, stime, cutime, cstime))
        (directory / "cmdline").write_bytes((cmdlines or {}).get(pid, comm.encode() + b"\0"))
    (root / "self").mkdir(exist_ok=True)   # not a pid: skipped
    return root


def test_a_stat_line_whose_command_name_holds_spaces_and_parentheses_parses_from_the_last_parenthesis():
    stat = procstat.parse_stat(_stat_line(42, "postgres: app (idle) x", 7, 120, 30, 5, 1))
    assert (stat.pid, stat.comm, stat.ppid) == (42, "postgres: app (idle) x", 7)
    assert (stat.utime, stat.stime, stat.cutime, stat.cstime) == (120, 30, 5, 1)
    assert stat.ticks == 156


def test_a_real_stat_line_of_this_machine_parses():
    own = procstat.parse_stat(Path("/proc/self/stat").read_text())
    assert own.pid > 1 and own.ppid >= 0 and own.utime >= 0


def test_a_tree_is_its_live_root_and_every_descendant_and_nothing_else(tmp_path):
    proc = _proc(tmp_path / "proc", {
        1: ("init", 0, 1, 1, 0, 0),
        10: ("postgres", 1, 100, 50, 0, 0),
        11: ("postgres", 10, 5, 5, 0, 0),
        12: ("postgres", 11, 2, 2, 0, 0),
        20: ("sshd", 1, 7, 7, 0, 0),
    })
    stats = procstat.read_all(proc)
    assert sorted(stats) == [1, 10, 11, 12, 20]
    assert procstat.tree(stats, [10]) == {10, 11, 12}
    assert procstat.tree(stats, [10, 99]) == {10, 11, 12}   # a root that is gone adds nothing
    assert procstat.tree_ticks(stats, [10]) == 150 + 10 + 4


def test_a_connection_process_that_exits_inside_the_window_is_still_counted_through_its_parents_cutime(tmp_path):
    # Before: the postmaster (10) and a backend (11) that has used 8 ticks.
    before = procstat.read_all(_proc(tmp_path / "before", {10: ("postgres", 1, 100, 0, 0, 0),
                                                           11: ("postgres", 10, 6, 2, 0, 0)}))
    # After: the backend used 4 more ticks, exited and was reaped (its 12 ticks are in the postmaster's
    # cutime/cstime); a new backend (12) was born and used 3; the postmaster itself used 1.
    after = procstat.read_all(_proc(tmp_path / "after", {10: ("postgres", 1, 101, 0, 9, 3),
                                                         12: ("postgres", 10, 2, 1, 0, 0)}))
    used = procstat.tree_ticks(after, [10]) - procstat.tree_ticks(before, [10])
    assert used == 4 + 3 + 1


def test_vmrss_is_read_in_kib_and_a_process_without_memory_has_none():
    assert procstat.parse_rss_kib("Name:\tpython\nVmPeak:\t 9000 kB\nVmRSS:\t   51234 kB\n") == 51234
    assert procstat.parse_rss_kib("Name:\tzombie\nState:\tZ (zombie)\n") is None


def test_a_retitled_server_is_found_by_a_path_inside_its_one_joined_argument(tmp_path):
    proc = _proc(tmp_path / "proc", {
        30: ("sshd", 1, 0, 0, 0, 0),
        31: ("sshd", 30, 0, 0, 0, 0),
        32: ("cat", 1, 0, 0, 0, 0),
    }, cmdlines={30: b"sshd: /usr/sbin/sshd -D -f /tmp/x/sshd_config [listener] 0 of 10-100 startups\0",
                 31: b"sshd: root@notty\0",
                 32: b"cat\0/tmp/x/sshd_config\0"})
    assert sorted(procstat.find_by_cmdline("/tmp/x/sshd_config", proc)) == [30, 32]
    assert procstat.parent_of(31, proc) == 30
    assert procstat.parent_of(99, proc) is None


def test_machine_busy_jiffies_leave_out_idle_and_iowait():
    busy, total = procstat.busy_jiffies("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 0 0 0\n")
    assert (busy, total) == (160, 1000)
