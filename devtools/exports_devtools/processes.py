"""Long-running ``exports`` processes (relay, workers, scheduler) for the demo and the tests: each
started by name in its own session with a log file, stopped with a signal and a bound, and killed only
if it outlives the bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exports_devtools.waiting import TimedOut, wait_until

#: The ``exports`` command by module: it needs no console script on the PATH.
EXPORTS = (sys.executable, "-m", "app.cli")
#: Seconds a process gets to exit after its stop signal before it is killed.
STOP_TIMEOUT = 20.0
#: Bytes of a log shown when a process misbehaves.
LOG_TAIL = 4000
#: Seconds a process gets to say it started before it is asked to stop anyway.
START_TIMEOUT = 60.0
#: The log event after which each command stops gracefully on its signal; before it, a signal's default
#: action may still end the process, which says nothing about its shutdown.
STARTED = {"relay": "relay.started", "scheduler": "scheduler.started", "worker": "worker.starting",
           "notifier": "notifier.started"}


def clean_environ(**overrides: str) -> dict[str, str]:
    """This process's environment without any EXPORTS_* setting of the developer's, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")}
    env.update(overrides)
    return env


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def pid_of_client_port(port: int) -> int | None:
    """The process holding the local TCP socket bound to ``port`` on the loopback (a client of one of our
    proxies), found the way ``ss -p`` does: the socket's inode in /proc/net/tcp, then the process whose
    file descriptors include it. None when it has closed meanwhile."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                inode = fields[9]
                break
        if inode:
            break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue   # gone, or not ours to look at
    return None


def kill(pid: int) -> None:
    """SIGKILL to ``pid``, and to its whole group when it leads one (dramatiq's worker processes are
    its children)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_process(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> bool:
    """Signals one process we started and waits for it, bounded; True when it exited by itself, False
    when it had to be killed. The signal goes to the process, as systemd's KillMode=mixed sends it
    (dramatiq's main process forwards it to its worker processes); tests/acceptance/test_worker_stops.py
    signals the group and the worker processes too."""
    if process.poll() is not None:
        return True
    try:
        process.send_signal(sig)
        process.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        kill(process.pid)
        process.wait(timeout)
        return False


def stop_pids(signals: Mapping[int, int], timeout: float = STOP_TIMEOUT) -> list[int]:
    """Signals processes that are not our children (``{pid: signal}``) all at once and waits for them
    within one bound; returns the pids that had to be killed."""
    for pid, sig in signals.items():
        if alive(pid):
            os.kill(pid, sig)
    try:
        wait_until(lambda: not any(alive(pid) for pid in signals), "the processes to exit", timeout)
        return []
    except TimedOut:
        left = [pid for pid in signals if alive(pid)]
        for pid in left:
            kill(pid)
        return left


@dataclass
class Running:
    name: str
    process: subprocess.Popen
    log_path: Path
    stop_signal: int = signal.SIGTERM
    #: The log text that says it handles its stop signal (``STARTED``), None for a command that says nothing.
    started_line: str | None = None
    #: Set by ``ProcessGroup.stop_all``: whether it was still running when asked, and whether it was killed.
    asked: bool = False
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def code(self) -> int | None:
        return self.process.poll()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def started_or_exited(self) -> bool:
        return self.process.poll() is not None or self.started_line is None or self.started_line in self.log()

    def problem(self) -> str | None:
        """What went wrong when it was stopped: killed, or a failing exit code when asked to stop (a
        process someone killed on purpose was not asked)."""
        if self.killed:
            return f"{self.name} did not stop within its bound after {signal.Signals(self.stop_signal).name}"
        if self.asked and self.process.returncode != 0:
            return f"{self.name} exited {self.process.returncode} when stopped"
        return None


@dataclass
class ProcessGroup:
    """``exports <command>`` subprocesses started with ``env``, their logs under ``log_dir``."""

    env: dict[str, str]
    log_dir: Path
    command: Sequence[str] = EXPORTS
    running: list[Running] = field(default_factory=list)

    def start(self, name: str, *args: str, stop_signal: int = signal.SIGTERM) -> Running:
        """Starts ``exports *args`` in a session of its own (so a kill can take its children too)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen([*self.command, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        started = Running(name, process, log_path, stop_signal, STARTED.get(args[0]) if args else None)
        self.running.append(started)
        return started

    def get(self, name: str) -> Running:
        return next(r for r in self.running if r.name == name)

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> list[Running]:
        """Signals every process at once, then waits for all within one bound, killing any that
        outlives it; returns them all (``problem()`` says which stop went wrong) and forgets them. A process
        still starting is first given START_TIMEOUT to say it started: a test that ends quickly must not
        signal a worker still importing, whose death by the signal would pass for a failed shutdown."""
        stopped, self.running = self.running, []
        try:
            wait_until(lambda: all(r.started_or_exited() for r in stopped), "the processes to finish starting",
                       START_TIMEOUT)
        except TimedOut:
            pass   # signalled all the same; one that dies of it is reported below
        for running in stopped:
            running.asked = running.process.poll() is None
            if running.asked:
                running.process.send_signal(running.stop_signal)
        try:
            wait_until(lambda: all(r.process.poll() is not None for r in stopped), "the processes to stop", timeout)
        except TimedOut:
            for running in stopped:
                if running.process.poll() is None:
                    running.killed = True
                    kill(running.pid)
                    running.process.wait(timeout)
        return stopped

    def logs(self) -> str:
        return "\n".join(f"--- {r.name} ---\n{r.log()[-LOG_TAIL:]}" for r in self.running)
