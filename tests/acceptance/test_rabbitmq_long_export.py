"""A long export under RabbitMQ: an attempt that outlasts the broker's redelivery horizon.

RabbitMQ closes a channel whose oldest unacknowledged delivery is older than ``consumer_timeout``
(30 minutes by default) with ``406 PRECONDITION_FAILED - delivery acknowledgement on channel N timed
out``, and requeues every delivery still unacknowledged on it. Our actor acks after it returns
(docs: design.md), so an export longer than the timeout has its wake-up delivered a second time
while it still runs. On RabbitMQ 3.10 the timeout is a node-wide setting only: the ``x-consumer-timeout``
queue argument is accepted and ignored, a ``consumer-timeout`` policy key is refused as unrecognised,
and vhost limits know only connections and queues. So this test starts a RabbitMQ node of its own, with
a short timeout (and a short channel tick, the interval at which RabbitMQ checks it), rather than
changing the machine's broker under everything else that uses it.

What Dramatiq (2.2, pika) does there: the consumer's iterator raises ``ChannelClosedByBroker``, the
consumer thread logs "Consumer encountered a connection error", reconnects after
``dramatiq_restart_delay`` (3 s) on a new connection and channel, and the broker redelivers the
message there (``redelivered`` set). An idle worker thread runs that copy: the runner reads the row,
finds it Running, and settles the copy. When the long attempt finally returns, Dramatiq acks its
delivery tag on the *new* channel's consumer: the tag is not among that consumer's known tags, so it
logs "Failed to ack message: not in known tags." and sends nothing. Delivery tags are numbered per
channel, so had the new channel by then delivered a message under the same number and not yet
settled it, that message would be acked early instead (a crash before it ran would lose it, and only
the sweeper would wake its job again); nothing here depends on that.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exports_devtools.processes import clean_environ
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
from tests.fixtures.processes import QUEUE, SYSTEM_SETTINGS, ExportsCli, System
from tests.support import unavailable

pytestmark = pytest.mark.rabbitmq

#: The broker's redelivery horizon in this test, in milliseconds: far below the time the test holds
#: the export's build, far above the time a quick export keeps its message.
CONSUMER_TIMEOUT_MS = 3_000
#: How often RabbitMQ checks the timeout, in milliseconds (60 s by default).
CHANNEL_TICK_MS = 500
#: Seconds the node may take to boot.
BOOT_TIMEOUT = 90
#: What RabbitMQ says when it closes the channel, as Dramatiq logs it.
TIMED_OUT = "PRECONDITION_FAILED - delivery acknowledgement on channel"
#: What Dramatiq logs when an ack is for a delivery its current consumer never received.
LATE_ACK = "Failed to ack message: not in known tags."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rabbitmq_script(name: str) -> Path | None:
    """The real script, not a distribution's wrapper that switches to the broker's system user."""
    found = shutil.which("rabbitmq-server")
    return Path(os.path.realpath(found)).parent / name if found else None


class ShortHorizonRabbitmq:
    """A RabbitMQ node of the test's own, in a temporary directory, with a short consumer timeout."""

    def __init__(self, base: Path):
        self.base = base
        self.node = f"exports-test-{os.getpid()}@localhost"
        self.port = _free_port()
        base.joinpath("rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nconsumer_timeout = {CONSUMER_TIMEOUT_MS}\n")
        base.joinpath("advanced.config").write_text(f"[{{rabbit, [{{channel_tick_interval, {CHANNEL_TICK_MS}}}]}}].\n")
        base.joinpath("enabled_plugins").write_text("[].\n")
        base.joinpath("rabbitmq-env.conf").write_text("")
        self.env = {
            **os.environ,
            "HOME": str(base),   # the Erlang cookie the node and rabbitmqctl share
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(_free_port()),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def ctl(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([str(_rabbitmq_script("rabbitmqctl")), "-n", self.node, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def start(self) -> None:
        with open(self.base / "server.log", "ab") as log:
            self.process = subprocess.Popen([str(_rabbitmq_script("rabbitmq-server"))], env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        # The node listens for AMQP only once it has booted; a node that died says why in its log.
        wait_until(self._listening, "the RabbitMQ node to listen", BOOT_TIMEOUT,
                   diagnostics=lambda: (self.base / "server.log").read_text(errors="replace")[-3000:])

    def _listening(self) -> bool:
        assert self.process is not None and self.process.poll() is None, (
            "the RabbitMQ node exited:\n" + (self.base / "server.log").read_text(errors="replace")[-3000:])
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM stops a node gracefully; one that does not stop in time is killed."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def queue_depth(self, queue: str) -> tuple[int, int]:
        """(ready, unacknowledged) messages of the queue, by the broker's own count."""
        for line in self.ctl("list_queues", "-q", "--no-table-headers", "name", "messages_ready",
                             "messages_unacknowledged").splitlines():
            name, ready, unacked = line.split()
            if name == queue:
                return int(ready), int(unacked)
        return 0, 0


@pytest.fixture(scope="module")
def short_horizon_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShortHorizonRabbitmq]:
    if _rabbitmq_script("rabbitmq-server") is None:
        unavailable("rabbitmq-server is not installed (Debian rabbitmq-server)")
    broker = ShortHorizonRabbitmq(tmp_path_factory.mktemp("rabbitmq"))
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def short_horizon_system(db_url: str, tmp_path: Path, process_group, embedded_sftp,
                         short_horizon_rabbitmq: ShortHorizonRabbitmq) -> Iterator[System]:
    """The processes' environment, as ``rabbitmq_system``, on the short-horizon node."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    env = clean_environ(EXPORTS_DATABASE_URL=db_url, EXPORTS_STATE_DIR=str(state_dir),
                        EXPORTS_BROKER_URL=short_horizon_rabbitmq.url, EXPORTS_WORK_DIR=str(tmp_path / "work"),
                        **SYSTEM_SETTINGS, **embedded_sftp.environ)
    group = process_group(env)
    try:
        yield System(ExportsCli(env), group, None)
    finally:
        group.stop_all()


def test_an_export_that_outlasts_the_brokers_consumer_timeout_runs_once_and_the_worker_carries_on(
        short_horizon_system, short_horizon_rabbitmq, admin, db_url, embedded_sftp):
    system, broker = short_horizon_system, short_horizon_rabbitmq
    system.start_relay()
    system.start_scheduler()
    worker = system.start_worker()
    set_up(system, embedded_sftp)
    holder = hold_builds(db_url)
    try:
        job_id = create(system)
        wait_status(system, admin, job_id, "Running")
        wait_until(lambda: builder_blocked_by(admin, holder), "the build to wait on the contacts lock", DEADLINE)
        # The build is held past the consumer timeout: the broker closes the worker's channel and
        # requeues the wake-up, Dramatiq reconnects, and the copy is delivered again and settled
        # (nothing ready, nothing unacknowledged) while the first delivery is still being processed.
        wait_until(lambda: TIMED_OUT in worker.log(), "the broker to close the channel", DEADLINE,
                   diagnostics=system.group.logs)
        wait_until(lambda: worker.log().count("export.processed") == 1 and broker.queue_depth(QUEUE) == (0, 0),
                   "the redelivered wake-up to be settled", DEADLINE,
                   diagnostics=lambda: f"{broker.queue_depth(QUEUE)}\n{system.group.logs()}")
        assert job_row(admin, job_id)["status"] == "Running"
    finally:
        holder.rollback()
        holder.close()

    wait_status(system, admin, job_id, "Completed")
    assert transitions(admin, job_id) == ["Claimed", "DeliveryAuthorized", "Finished"]
    assert job_row(admin, job_id)["attempt_count"] == 1
    assert_delivered_once(admin, embedded_sftp, job_id)
    # One wake-up was written and published; the second run of the actor was the broker's redelivery.
    assert len(admin.execute("SELECT 1 FROM outbox WHERE job_id = %s", (job_id,)).fetchall()) == 1
    # The long attempt's ack comes after the reconnection, for a delivery the closed channel held.
    wait_until(lambda: LATE_ACK in worker.log(), "the late ack of the first delivery", DEADLINE,
               diagnostics=system.group.logs)
    assert worker.log().count("export.processed") == 2

    # The same worker process, still running, consumes and delivers the next export normally.
    assert worker.process.poll() is None
    second = create(system)
    wait_status(system, admin, second, "Completed")
    assert transitions(admin, second) == ["Claimed", "DeliveryAuthorized", "Finished"]
    wait_until(lambda: broker.queue_depth(QUEUE) == (0, 0), "the queue to hold nothing ready or unacknowledged",
               DEADLINE, diagnostics=lambda: f"{broker.queue_depth(QUEUE)}\n{system.group.logs()}")
