"""A real worker process: `dramatiq app.worker` on real Redis (EXPORTS_TEST_BROKER_URL, or an
embedded Redis named by its socket) delivers a job created through the store exactly once, even when its
wake-up is published twice (the copy is skipped by its message id). And `exports worker` on a machine
with nothing configured starts the embedded services once and hands them to its worker processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import embedded, relay
from app.broker import build_broker
from app.config import Settings
from app.store import export, heartbeat
from app.store.database import connect
from app.store.relay import OutboxMessage
from app.store.types import Role
from exports_devtools.processes import clean_environ, stop_process
from exports_devtools.waiting import wait_until
from tests.fixtures.worker import insert_contacts, insert_destination

ROOT = Path(__file__).resolve().parents[2]
#: How long the worker gets to deliver, in seconds: process start-up included.
DEADLINE_SECONDS = 60.0


@pytest.fixture
def state_dir(tmp_path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def broker_url(state_dir) -> Iterator[str]:
    """EXPORTS_TEST_BROKER_URL, or an embedded Redis of the test's own, named by its socket: a worker
    given a database must be given its broker."""
    configured = os.environ.get("EXPORTS_TEST_BROKER_URL")
    if configured:
        yield configured
        return
    server = embedded.start_redis(Settings(state_dir=state_dir))
    try:
        yield f"unix://{server.socket_file}"
    finally:
        embedded.stop_redis(server)


@pytest.fixture
def broker(broker_url) -> Iterator:
    broker = build_broker(Settings(broker_url=broker_url))
    yield broker
    broker.close()


def _start_worker(db_url: str, broker_url: str, state_dir: Path, environ: dict[str, str],
                  log_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")}
    env.update(environ)
    env.update(EXPORTS_DATABASE_URL=db_url, EXPORTS_STATE_DIR=str(state_dir), EXPORTS_LEASE_SECONDS="10",
               EXPORTS_RENEW_SECONDS="2", EXPORTS_STOP_POLL_SECONDS="1")
    env["EXPORTS_BROKER_URL"] = broker_url
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "app.worker", "--processes", "1", "--threads", "1"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _handled(log_path: Path) -> int:
    text = log_path.read_text(errors="replace")
    return text.count("export.processed") + text.count("dedup.skipped")


def test_a_worker_process_delivers_a_job_exactly_once_even_when_its_wake_up_arrives_twice(
        seed, conn, admin, db_url, embedded_sftp, broker, broker_url, state_dir, tmp_path):
    tenant_id = seed.tenant()
    destination_id = insert_destination(conn, tenant_id, embedded_sftp.config)
    insert_contacts(conn, tenant_id, 40, consent=True)
    job = seed.queued(tenant_id, destination_id)
    untouched = seed.queued(tenant_id, destination_id)   # never woken: must stay Queued
    [row] = seed.outbox(job)
    message = relay.message_for(OutboxMessage(row["message_id"], row["kind"], row["job_id"], row["created_at"]))

    log_path = tmp_path / "worker.log"
    worker = _start_worker(db_url, broker_url, state_dir, embedded_sftp.environ, log_path)

    def log() -> str:
        return log_path.read_text(errors="replace")[-3000:]

    def settled() -> bool:
        assert worker.poll() is None, log()
        return seed.status(job).value not in ("Queued", "Running", "Delivering")

    try:
        broker.enqueue(message)
        broker.enqueue(message)   # the relay published the same outbox row twice
        wait_until(settled, "the job to settle", DEADLINE_SECONDS, interval=0.1, diagnostics=log)
        # One thread, so the copy comes after the first returned: skipped by its message id.
        wait_until(lambda: _handled(log_path) >= 2, "both copies of the wake-up to be handled", DEADLINE_SECONDS,
                   interval=0.1, diagnostics=log)
    finally:
        stop_process(worker, timeout=30)

    row = seed.row(job)
    assert (row["status"], row["attempt_count"]) == ("Completed", 1), log_path.read_text(errors="replace")[-3000:]
    kinds = seed.event_kinds(job)
    assert kinds.count("Claimed") == 1 and kinds.count("Finished") == 1
    assert list(embedded_sftp.files()) == [export.final_name(job.delivery_key)]
    assert seed.status(untouched).value == "Queued"
    text = log_path.read_text(errors="replace")
    assert (text.count("export.processed"), text.count("dedup.skipped")) == (1, 1)
    assert worker.returncode is not None


@pytest.fixture
def own_state_dir() -> Iterator[Path]:
    """A state directory outside pytest's basetemp, as conftest's embedded server has: a pytest run
    starting meanwhile (another xdist worker's, anyone's) resets the basetemp root to 0700, which locks
    the embedded server's own user out of its data directory."""
    path = Path(tempfile.mkdtemp(prefix="exports-test-worker-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_exports_worker_with_nothing_configured_starts_the_embedded_services_once_for_all_its_worker_processes(
        own_state_dir, tmp_path):
    state_dir = own_state_dir
    settings = Settings(state_dir=state_dir)
    log_path = tmp_path / "worker.log"
    env = clean_environ(EXPORTS_STATE_DIR=str(state_dir), EXPORTS_WORKER_METRICS="off",
                        EXPORTS_HEARTBEAT_SECONDS="0.5")
    with log_path.open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--processes", "2", "--threads", "1"],
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def text() -> str:
        return log_path.read_text(errors="replace")

    def live_workers(url: str) -> int:
        assert worker.poll() is None, text()[-3000:]
        with connect(url, Role.APP, application_name="exports-test") as conn:
            return sum(1 for p in heartbeat.processes(conn) if p.identity.role == "worker" and p.stopped_at is None)

    try:
        wait_until(lambda: "embedded.redis_started" in text(), "the worker to start the embedded services",
                   DEADLINE_SECONDS, interval=0.2, diagnostics=lambda: text()[-3000:])
        url = embedded.start(settings).app   # joins the server the worker started
        wait_until(lambda: live_workers(url) == 2, "both worker processes to beat on the embedded database",
                   DEADLINE_SECONDS, interval=0.2, diagnostics=lambda: text()[-3000:])
    finally:
        stop_process(worker, timeout=30)
        embedded.stop_database(settings)

    # The parent started each service once; no worker process started or joined one of its own.
    assert (text().count("embedded.database_started"), text().count("embedded.redis_started")) == (1, 1), text()
    assert "joined=False" in text().split("embedded.database_started", 1)[1].splitlines()[0]
