"""Many hosts: the relay, the workers and the scheduler each run as a host of its own (its own hostname and
its own mount namespace, with a work directory at the same path that only it sees), reaching PostgreSQL and
Redis over TCP only. Exports are delivered, a worker host that dies mid-build is recovered by the scheduler
host and the export delivered once by another worker host, and the dead host's leftover file is scavenged
by that host's own workers when they come back, never by another host's."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from app import embedded
from app.config import Settings
from exports_devtools.pgproxy import PgProxy
from exports_devtools.processes import EXPORTS, ProcessGroup, clean_environ
from exports_devtools.tcp_proxy import TcpProxy
from exports_devtools.waiting import wait_until
from tests.acceptance.steps import (
    DEADLINE,
    assert_delivered_once,
    builder_blocked_by,
    create,
    hold_builds,
    job_row,
    set_up,
    transitions,
    wait_status,
)
from tests.fixtures.processes import SYSTEM_SETTINGS, stop_all
from tests.support import unavailable

IN_CI = os.environ.get("CI") == "true"
#: The work directory's path on every host; each host mounts its own directory there.
COMMON_WORK = Path("/var/tmp/exports-host-work")
HOST_SCRIPT = """\
set -e
hostname "$EXPORTS_TEST_HOST"
mkdir -p "$EXPORTS_TEST_COMMON_WORK"
mount --bind "$EXPORTS_TEST_HOST_WORK" "$EXPORTS_TEST_COMMON_WORK"
exec "$@"
"""


@pytest.fixture
def hosts_supported() -> None:
    problem = None
    if os.geteuid() != 0:
        problem = "a host of its own needs root (unshare --uts --mount)"
    elif shutil.which("unshare") is None:
        problem = "unshare (util-linux) is not installed"
    if problem:
        unavailable(problem)


@pytest.fixture
def tcp_only(db_url: str, tmp_path: Path):
    """The database and the broker as a remote host sees them: TCP addresses on loopback, whatever the
    test's services listen on (the embedded ones listen on Unix sockets only)."""
    database = PgProxy.in_front_of(db_url)
    configured = os.environ.get("EXPORTS_TEST_BROKER_URL")
    redis_server = redis_proxy = None
    if configured:
        broker_url = configured
    else:
        redis_server = embedded.start_redis(Settings(state_dir=tmp_path / "redis"))
        redis_proxy = TcpProxy(redis_server.socket_file)
        broker_url = f"redis://127.0.0.1:{redis_proxy.port}/0"
    try:
        yield database.url, broker_url
    finally:
        database.close()
        if redis_proxy is not None:
            redis_proxy.close()
        if redis_server is not None:
            embedded.stop_redis(redis_server)


class Hosts:
    def __init__(self, tmp_path: Path, environ: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.environ = environ
        self.script = tmp_path / "host.sh"
        self.script.write_text(HOST_SCRIPT)
        self.groups: dict[str, ProcessGroup] = {}

    def work_dir(self, host: str) -> Path:
        return self.tmp_path / "hosts" / host / "work"

    def start(self, host: str, *args: str) -> None:
        """``exports *args`` as host ``host``: unshare without --fork execs in place, so the pid the harness
        signals is the process's own."""
        self.work_dir(host).mkdir(parents=True, exist_ok=True)
        env = {**self.environ, "EXPORTS_TEST_HOST": host, "EXPORTS_TEST_HOST_WORK": str(self.work_dir(host)),
               "EXPORTS_TEST_COMMON_WORK": str(COMMON_WORK), "EXPORTS_WORK_DIR": str(COMMON_WORK)}
        command = ("unshare", "--uts", "--mount", "--", "sh", str(self.script), *EXPORTS)
        group = self.groups.setdefault(host, ProcessGroup(env, self.tmp_path / "logs" / host, command=command))
        group.start(args[0], *args)

    def logs(self) -> str:
        return "".join(group.logs() for group in self.groups.values())

    def stop_all(self) -> None:
        for group in self.groups.values():
            stop_all(group)


@pytest.fixture
def hosts(hosts_supported, tcp_only, tmp_path, embedded_sftp, system):
    database_url, broker_url = tcp_only
    environ = clean_environ(EXPORTS_DATABASE_URL=database_url, EXPORTS_BROKER_URL=broker_url,
                            EXPORTS_STATE_DIR=str(tmp_path / "state"), EXPORTS_SCAVENGE_INTERVAL="0.5",
                            **SYSTEM_SETTINGS, **embedded_sftp.environ)
    running = Hosts(tmp_path, environ)
    try:
        yield running
    finally:
        running.stop_all()


def test_workers_and_the_scheduler_on_hosts_of_their_own_deliver_recover_and_each_scavenge_their_own_files(
        hosts, system, admin, db_url, embedded_sftp):
    set_up(system, embedded_sftp)
    hosts.start("relay-host", "relay")
    hosts.start("scheduler-host", "scheduler")
    hosts.start("worker-a", "worker", "--processes", "1", "--threads", "2")

    first = create(system)
    wait_status(system, admin, first, "Completed")
    assert job_row(admin, first)["claimed_by"].startswith("worker-a:")
    assert_delivered_once(admin, embedded_sftp, first)

    # worker-a dies mid-build: its file stays in its own work directory, which no other host sees.
    holder = hold_builds(db_url)
    try:
        second = create(system)
        wait_status(system, admin, second, "Running")
        wait_until(lambda: builder_blocked_by(admin, holder), "the build to wait on the contacts lock", DEADLINE)
        dead_attempt = job_row(admin, second)["attempt_id"]
        leftover = [p.name for p in hosts.work_dir("worker-a").iterdir()]
        assert leftover == [f"{second}.{dead_attempt}.csv.part"]
        group = hosts.groups["worker-a"]
        for running in group.running:
            os.killpg(running.pid, signal.SIGKILL)   # the host's whole worker, its forked processes too
        group.running.clear()
    finally:
        holder.rollback()
        holder.close()

    # The scheduler host takes the attempt over; a worker on another host delivers it, once.
    hosts.start("worker-b", "worker", "--processes", "1", "--threads", "2")
    wait_status(system, admin, second, "Completed")
    assert transitions(admin, second) == ["Claimed", "RequeuedByRecovery", "Claimed", "DeliveryAuthorized",
                                           "Finished"]
    assert job_row(admin, second)["claimed_by"].startswith("worker-b:")
    assert (hosts.work_dir("worker-a") / leftover[0]).exists()   # worker-b's scavenger cannot see it

    # worker-a comes back: its own scavenger removes the file of the attempt that ended.
    hosts.start("worker-a", "worker", "--processes", "1", "--threads", "2")
    wait_until(lambda: not any(hosts.work_dir("worker-a").iterdir()), "worker-a's scavenger to remove its leftover",
               DEADLINE, diagnostics=hosts.logs)

    listed = system.cli("processes", "--json").json
    alive = {(p["host"], p["role"]) for p in listed if p["state"] == "alive"}
    assert {("relay-host", "relay"), ("scheduler-host", "scheduler"), ("worker-a", "worker"),
            ("worker-b", "worker")} <= alive
