"""CPU and memory of process trees, read from /proc.

PostgreSQL and sshd fork a process per connection, and a connection's process may start and exit
inside a measuring window, so sampling the pids alive at its two ends misses them. A tree's counter
is the sum, over the live processes of the tree, of utime + stime + cutime + cstime: a process that
exited and was waited for moved its own time, and that of every child it had waited for, into its
parent's cutime and cstime, so it is still counted, once; a process still running is counted by its
own utime and stime. While the tree's root lives the counter only grows, and the difference of two
readings is what the tree used in between, processes born and gone in between included. (A process
that exited but was not yet waited for is a zombie whose stat still holds its times.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat a tree's counter needs; times in clock ticks."""

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int

    @property
    def ticks(self) -> int:
        """This process's time and that of every child it has waited for."""
        return self.utime + self.stime + self.cutime + self.cstime


def parse_stat(text: str) -> ProcStat:
    """One /proc/<pid>/stat line. The command name is in parentheses and may itself hold spaces and
    parentheses, so the fields after it are found from the last ``)``."""
    head, _, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    # fields[0] is field 3 of proc(5) (state): ppid is field 4, utime..cstime fields 14-17.
    return ProcStat(int(pid_text), comm, int(fields[1]), int(fields[11]), int(fields[12]), int(fields[13]),
                    int(fields[14]))


def read_all(proc: Path = PROC) -> dict[int, ProcStat]:
    """Every process on the machine now; one that exits while this reads is left out."""
    stats: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stats[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return stats


def tree(stats: Mapping[int, ProcStat], roots: Iterable[int]) -> set[int]:
    """The roots that are alive and all their live descendants."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    stack = [pid for pid in roots if pid in stats]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack += children.get(pid, [])
    return found


def tree_ticks(stats: Mapping[int, ProcStat], roots: Iterable[int]) -> int:
    """The tree's counter (see the module's docstring)."""
    return sum(stats[pid].ticks for pid in tree(stats, roots))


def ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


def tree_seconds(roots: Iterable[int], stats: Mapping[int, ProcStat] | None = None) -> float:
    """The counter of the trees under ``roots``, in CPU seconds."""
    return tree_ticks(read_all() if stats is None else stats, roots) / ticks_per_second()


def parse_rss_kib(status_text: str) -> int | None:
    """VmRSS from /proc/<pid>/status, in KiB; None for a process with no memory of its own (a zombie)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def rss_kib(pid: int, proc: Path = PROC) -> int | None:
    try:
        return parse_rss_kib((proc / str(pid) / "status").read_text())
    except OSError:
        return None


def parent_of(pid: int, proc: Path = PROC) -> int | None:
    try:
        return parse_stat((proc / str(pid) / "stat").read_text()).ppid
    except (OSError, ValueError, IndexError):
        return None


def find_by_cmdline(needle: str, proc: Path = PROC) -> list[int]:
    """Processes whose command line holds ``needle`` (a config file's path, say). Searched as text,
    since a server that retitles itself (sshd's listener) joins its arguments into one."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(int(entry.name))
    return found


def busy_jiffies(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat's first line; idle and iowait are not busy."""
    fields = [int(x) for x in stat_text.split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def machine_jiffies(proc: Path = PROC) -> tuple[int, int]:
    return busy_jiffies((proc / "stat").read_text())
