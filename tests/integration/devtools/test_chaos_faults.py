"""The chaos soak's faults, each injected into one running system (devtools/exports_devtools/chaos/system.py): every
kind finds its point while exports flow, strikes, leaves nothing armed or stopped behind, and an export
created afterwards is still delivered. The services are the configured test ones
(EXPORTS_TEST_DATABASE_URL, EXPORTS_TEST_BROKER_URL on a database number of its own), else embedded."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.store import export
from app.store.database import connect
from app.store.types import Role, Status
from exports_devtools.chaos.faults import KINDS
from exports_devtools.chaos.system import ChaosSystem, url_with_db
from exports_devtools.store import owner as store
from exports_devtools.waiting import wait_until


def _chaos_broker(configured: str) -> str:
    """The configured Redis, on the database number below the test worker's own (tests/conftest.py),
    which no other test uses: the chaos system's workers would take another system's messages."""
    return url_with_db(configured, int(configured.partition("?")[0].rpartition("/")[2] or 0) - 1)


#: Seconds an export created after a fault may take to be delivered (a restarted worker included).
DELIVERY_TIMEOUT = 60.0
#: Seconds between two exports of the stream that gives a fault its point.
STREAM_INTERVAL = 0.4
#: psycopg's prepare_threshold: runs of one statement on a connection before it is prepared.
PREPARED_AFTER = 5
FINAL = {Status.COMPLETED, Status.FAILED, Status.OUTCOME_UNKNOWN, Status.STOPPED, Status.CANCELED, Status.REJECTED}


@pytest.fixture(scope="module")
def system() -> Iterator[ChaosSystem]:
    broker = os.environ.get("EXPORTS_TEST_BROKER_URL")
    # Not under pytest's basetemp: another pytest session resets its permissions, and the embedded
    # server (run as its own user when we are root) could no longer reach its data to restart.
    state_dir = Path(tempfile.mkdtemp(prefix="exports-chaos-"))
    chaos = ChaosSystem(state_dir, database_url=os.environ.get("EXPORTS_TEST_DATABASE_URL"),
                        broker_url=_chaos_broker(broker) if broker else None, drop_database=True)
    try:
        with chaos:
            yield chaos
        assert chaos.stop_problems == []
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _create(system: ChaosSystem) -> uuid.UUID:
    assert system.tenant_id is not None
    job_id = uuid.uuid4()
    with connect(system.app_url, Role.APP) as conn:
        created = export.create(conn, job_id=job_id, tenant_id=system.tenant_id,
                                destination_id=system.destination_ids[0], delivery_key=uuid.uuid4().hex,
                                created_by=system.operator)
    assert created is export.CreateResult.CREATED
    return job_id


def _status(system: ChaosSystem, job_id: uuid.UUID) -> Status | None:
    with connect(system.app_url, Role.APP) as conn:
        ownership = export.read_ownership(conn, job_id=job_id)
    return ownership.status if ownership else None


def _final_status(system: ChaosSystem, job_id: uuid.UUID) -> Status:
    def diagnostics() -> str:
        return f"status {_status(system, job_id)}\n{system.processes.logs() if system.processes else ''}"

    final = wait_until(lambda: s if (s := _status(system, job_id)) in FINAL else None,
                       f"export {job_id} to reach a final state", DELIVERY_TIMEOUT, diagnostics=diagnostics)
    assert final is not None
    return final


class _Stream:
    """Exports created one after another in a thread, so a fault's point comes."""

    def __init__(self, system: ChaosSystem) -> None:
        self.system = system
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="stream", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                _create(self.system)
            except Exception as exc:   # a database fault can refuse a creation; the stream goes on
                self.errors.append(exc)
            self.stop.wait(STREAM_INTERVAL)

    def __enter__(self) -> _Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_fault_strikes_while_exports_flow_and_an_export_created_afterwards_is_delivered(system, kind):
    stop = threading.Event()
    with _Stream(system):
        injection = KINDS[kind].inject(system, random.Random(kind), stop)
    assert injection is not None, f"{kind} never found its point"
    assert injection.kind == kind and injection.started <= injection.ended and injection.blocks
    system.ensure_running()
    assert _final_status(system, _create(system)) is Status.COMPLETED


def test_the_partner_journal_counts_one_finalization_per_delivered_file(system):
    job_id = _create(system)
    assert _final_status(system, job_id) is Status.COMPLETED
    with connect(system.owner_url, Role.APP) as conn:
        row = conn.execute("SELECT delivery_key FROM export_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    name = export.final_name(row["delivery_key"])
    assert system.partner_renames()[name] == 1
    (renamed,) = [r for r in system.partner_journal() if r.name == name]
    placed = system.partner_files()[renamed.path]
    assert (renamed.size, Path(placed).stat().st_size) == (placed.stat().st_size, renamed.size)


def test_a_worker_is_found_by_the_claimed_by_of_its_attempts(system):
    worker = system.workers()[0]
    # A worker restarted by an earlier test may not have forked its children yet.
    child = wait_until(lambda: next((int(p) for p in os.listdir("/proc")
                                     if p.isdigit() and _parent(int(p)) == worker.pid), None),
                       f"a child of worker {worker.pid}", timeout=60)
    assert system.worker_for(f"host:{child}:1") is worker
    assert system.worker_for(f"host:{worker.pid}:1") is worker
    assert system.worker_for("host:1:1") is None
    assert system.worker_for(None) is None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_statement_psycopg_has_prepared_is_still_recognised_by_the_proxy(system):
    assert system.proxy is not None
    with store.connect_owner(system.proxy.url_for(system.owner_url)) as conn:
        for _ in range(PREPARED_AFTER + 1):   # from the fifth run on, only the prepared name is sent
            store.attempt_owner(conn, uuid.uuid4())
        hold = system.proxy.hold_statement("owner_attempt_owner")
        held = threading.Thread(target=store.attempt_owner, args=(conn, uuid.uuid4()))
        held.start()
        assert hold.reached.wait(60)
        hold.release()
        held.join(10)
        cut = system.proxy.cut_before("owner_attempt_owner")
        with pytest.raises(psycopg.OperationalError):
            store.attempt_owner(conn, uuid.uuid4())
        # The proxy closes the connection, then marks the cut fired: the client can see the first first.
        cut.wait()
