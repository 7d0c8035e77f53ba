"""The runner when the partner cannot be reached, is busy, or refuses the configuration, against real
SFTP peers (the embedded server, and a real OpenSSH where marked), with the store's real statements:
nothing reversible is ever turned into a final Failed by a transient fault."""

from __future__ import annotations

import json

import psycopg
import pytest

from app import logs, metrics
from app.actors.builder import ContactsBuilder
from app.actors.deferral import CIRCUIT_OPEN, DeferralPolicy
from app.actors.runner import RunOutcome
from app.actors.slots import DatabaseSlots
from app.delivery.destination import Destination
from app.delivery.evidence import Evidence, EvidenceStage
from app.delivery.sessions import SessionPool
from app.store import export, partner
from app.store.database import Database
from app.store.types import CancellationOutcome, Role, Status, WriteResult
from exports_devtools.waiting import wait_until
from tests.fixtures.sftp import key_secrets, make_client_key
from tests.fixtures.worker import Gate, insert_destination
from tests.support import Background

#: Short enough that a test never waits on it; the tests move the clock instead.
POLICY = DeferralPolicy(base_seconds=5.0, max_seconds=60.0, total_seconds=3600.0, probe_seconds=30.0)
HARNESSES = ["worker", pytest.param("openssh_worker", marks=pytest.mark.openssh)]


class CountingBuilder(ContactsBuilder):
    """The real builder, counting the builds it starts."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.builds = 0

    def build(self, **kwargs):
        self.builds += 1
        return super().build(**kwargs)


def _through_proxy(worker, fault_proxy):
    proxy, routed = fault_proxy(worker.peer)
    return proxy, insert_destination(worker.conn, worker.tenant_id, routed.config)


def _kinds(worker, job) -> list[str]:
    return worker.seed.event_kinds(job)


def _circuit(worker, destination_id):
    return partner.read_circuit(worker.conn, destination_id=destination_id)


def _probe_due(worker, destination_id):
    """Time travel: the circuit's next probe is due."""
    worker.admin.execute("UPDATE destination_circuits SET next_probe_at = clock_timestamp() - interval '1 second'"
                         " WHERE destination_id = %s", (destination_id,))


@pytest.mark.parametrize("harness", HARNESSES)
def test_a_partner_that_refuses_connections_defers_the_job_opens_its_circuit_and_nothing_is_sent(
        request, harness, fault_proxy):
    worker = request.getfixturevalue(harness)
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    proxy.refuse_connections()
    job = worker.queued(destination_id)

    result = worker.runner(deferrals=POLICY).run(job.id)

    assert (result.outcome, result.write) == (RunOutcome.DEFERRED, WriteResult.WRITTEN)
    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"], row["deferrals"], row["attempt_count"]) == ("Queued", None, 1, 1)
    assert row["last_deferral"].startswith("connecting:") and row["delivery_authorized_at"] is None
    assert _kinds(worker, job) == ["Claimed", "DeferredPartnerUnavailable"]
    wakeup = worker.seed.outbox(job)[-1]
    assert wakeup["due_at"] == row["woken_at"] and wakeup["due_at"] > row["deferred_since"]
    circuit = _circuit(worker, destination_id)
    assert circuit.open and circuit.last_error.startswith("connecting:")
    assert proxy.connections_refused >= 1
    assert worker.peer.files() == {} and worker.local_files() == []


def test_while_the_circuit_is_open_other_jobs_defer_right_after_their_claim_without_building(worker, fault_proxy):
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    proxy.refuse_connections()
    first, second = worker.queued(destination_id), worker.queued(destination_id)
    builder = CountingBuilder(worker.db_url, worker.work_dir)
    runner = worker.runner(deferrals=POLICY, builder=builder)
    assert runner.run(first.id).outcome is RunOutcome.DEFERRED
    refused = proxy.connections_refused

    result = runner.run(second.id)

    assert result.outcome is RunOutcome.DEFERRED
    assert (builder.builds, proxy.connections_refused) == (1, refused)   # no build, no connection attempt
    assert worker.seed.row(second)["last_deferral"] == CIRCUIT_OPEN
    # It comes back just after the circuit's next probe is due, not before.
    row = worker.seed.row(second)
    assert (row["woken_at"] - row["deferred_since"]).total_seconds() >= POLICY.base_seconds * 0.5


def test_a_due_probe_connects_before_it_builds_and_either_defers_or_closes_the_circuit_and_delivers(
        worker, fault_proxy):
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    proxy.refuse_connections()
    opener, prober = worker.queued(destination_id), worker.queued(destination_id)
    builder = CountingBuilder(worker.db_url, worker.work_dir)
    runner = worker.runner(deferrals=POLICY, builder=builder)
    assert runner.run(opener.id).outcome is RunOutcome.DEFERRED
    _probe_due(worker, destination_id)

    still_down = runner.run(prober.id)

    # The probe tried the partner and built nothing; the circuit reopened with a longer backoff.
    assert still_down.outcome is RunOutcome.DEFERRED and builder.builds == 1
    circuit = _circuit(worker, destination_id)
    assert circuit.open and circuit.failures == 2 and not circuit.probe_held
    proxy.accept_connections()
    _probe_due(worker, destination_id)

    back = runner.run(prober.id)

    assert (back.outcome, back.delivery, back.write) == (RunOutcome.DELIVERED, Status.COMPLETED, WriteResult.WRITTEN)
    assert not _circuit(worker, destination_id).open
    assert runner.run(opener.id).delivery is Status.COMPLETED
    assert sorted(worker.peer.files()) == sorted(export.final_name(j.delivery_key) for j in (opener, prober))
    assert builder.builds == 3


@pytest.mark.parametrize("harness", HARNESSES)
def test_a_rejected_credential_fails_at_once_with_a_detail_that_names_it_and_never_the_secret(
        request, harness, tmp_path, caplog):
    worker = request.getfixturevalue(harness)
    environ = dict(worker.peer.environ)
    secrets = tuple(worker.peer.secrets)
    if worker.peer.kind == "embedded":
        environ[next(iter(environ))] = worker.peer.secrets[0][::-1]   # a wrong password
        secrets += (environ[next(iter(environ))],)
    else:
        unknown = make_client_key(tmp_path / "unknown-key")   # a key the server does not know
        environ[next(iter(environ))] = str(unknown.private_path)
        secrets += key_secrets(unknown)
    job = worker.queued()

    result = worker.runner(deferrals=POLICY,
                           destination_for=lambda config: Destination(config, environ=environ)).run(job.id)

    assert (result.outcome, result.write) == (RunOutcome.FAILED, WriteResult.WRITTEN)
    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"], row["deferrals"], row["delivery_authorized_at"]) == (
        "Failed", "NotDelivered", 0, None)
    failed = worker.seed.events(job)[-1]
    assert failed["kind"] == "Failed"
    assert failed["detail"].startswith("NotDelivered (configuration): the partner refused the configuration")
    assert "Authentication" in failed["detail"]
    texts = [failed["detail"], *(logs.TextFormatter().format(r) for r in caplog.records)]
    assert not [s for s in secrets for t in texts if s in t]
    assert not _circuit(worker, worker.destination_id).open
    assert worker.peer.files() == {} and worker.local_files() == []


def test_a_host_key_other_than_the_pinned_one_fails_at_once_as_a_configuration_error(worker, openssh_sftp):
    # A destination row for the embedded server's address, pinned to OpenSSH's key.
    key = openssh_sftp.config.host_key.split(None, 1)[1]
    config = worker.peer.with_config(host_key=f"[127.0.0.1]:{worker.peer.config.port} {key}").config
    job = worker.queued(insert_destination(worker.conn, worker.tenant_id, config))

    result = worker.runner(deferrals=POLICY).run(job.id)

    assert result.outcome is RunOutcome.FAILED
    detail = worker.seed.events(job)[-1]["detail"]
    assert detail.startswith("NotDelivered (configuration):") and "HostKeyMismatch" in detail
    assert worker.seed.row(job)["deferrals"] == 0


def test_a_stop_request_recorded_while_the_partner_is_down_ends_stopped_instead_of_deferred(worker, fault_proxy):
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    proxy.refuse_connections()
    job = worker.queued(destination_id)
    gate = Gate()
    # The watcher never notices in time: the deferral's own condition must refuse.
    runner = worker.runner(deferrals=POLICY, checkpoint=gate, stop_poll_seconds=60, listen=False)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    assert worker.request_stop(job).outcome is CancellationOutcome.STOP_REQUESTED
    gate.open()

    result = run.result()

    assert (result.outcome, result.write) == (RunOutcome.STOPPED, WriteResult.WRITTEN)
    assert _kinds(worker, job) == ["Claimed", "Stopped"]
    assert worker.seed.row(job)["deferrals"] == 0 and len(worker.seed.outbox(job)) == 1
    assert worker.peer.files() == {} and worker.local_files() == []


def test_a_stop_request_during_a_deferral_cancels_the_job_and_no_file_is_ever_written(worker, fault_proxy):
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    proxy.refuse_connections()
    job = worker.queued(destination_id)
    runner = worker.runner(deferrals=POLICY)
    assert runner.run(job.id).outcome is RunOutcome.DEFERRED

    answer = worker.request_stop(job)
    proxy.accept_connections()
    late = runner.run(job.id)   # the deferral's wake-up, once due

    assert (answer.outcome, answer.found_status) == (CancellationOutcome.CANCELED_WHILE_QUEUED, Status.QUEUED)
    assert late.outcome is RunOutcome.NOT_QUEUED
    assert worker.seed.status(job) is Status.CANCELED
    assert _kinds(worker, job) == ["Claimed", "DeferredPartnerUnavailable"]
    assert worker.peer.files() == {} and worker.local_files() == []


def test_a_job_deferred_past_its_budget_fails_not_delivered_with_the_last_cause(worker, fault_proxy):
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    proxy.refuse_connections()
    job = worker.queued(destination_id)
    runner = worker.runner(deferrals=POLICY)
    assert runner.run(job.id).outcome is RunOutcome.DEFERRED
    worker.admin.execute("UPDATE export_jobs SET deferred_since = clock_timestamp() - interval '2 hours'"
                         " WHERE id = %s", (job.id,))
    _probe_due(worker, destination_id)

    result = runner.run(job.id)

    assert (result.outcome, result.write) == (RunOutcome.FAILED, WriteResult.WRITTEN)
    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"], row["deferrals"]) == ("Failed", "NotDelivered", 1)
    detail = worker.seed.events(job)[-1]["detail"]
    assert detail.startswith("NotDelivered (transient): the partner could not be reached for")
    assert "connecting:" in detail
    assert worker.peer.files() == {}


def test_an_originals_occupied_final_name_ends_failed_from_running_before_cutoff_2(worker):
    job = worker.queued()
    final = export.final_name(job.delivery_key)
    (worker.peer.inbox / final).write_bytes(b"someone else's file\n")

    result = worker.runner(deferrals=POLICY).run(job.id)

    assert (result.outcome, result.write) == (RunOutcome.FAILED, WriteResult.WRITTEN)
    row = worker.seed.row(job)
    assert (row["status"], row["failure_reason"], row["delivery_authorized_at"]) == ("Failed", "FinalNameOccupied",
                                                                                     None)
    events = worker.seed.events(job)
    assert [e["kind"] for e in events] == ["Claimed", "DeliveryEvidence", "Failed"]
    baseline = Evidence.from_detail(events[1]["detail"])
    assert (baseline.stage, baseline.listing.present) == (EvidenceStage.BASELINE, True)
    assert events[2]["detail"].startswith("FinalNameOccupied (permanent):")
    assert worker.peer.files() == {final: b"someone else's file\n"} and worker.local_files() == []


def test_a_stop_request_recorded_before_the_occupied_final_name_is_found_wins(worker):
    job = worker.queued()
    (worker.peer.inbox / export.final_name(job.delivery_key)).write_bytes(b"taken\n")
    gate = Gate()
    runner = worker.runner(deferrals=POLICY, checkpoint=gate, stop_poll_seconds=60, listen=False)
    run = Background(lambda: runner.run(job.id))
    assert gate.reached.wait(60)
    assert worker.request_stop(job).outcome is CancellationOutcome.STOP_REQUESTED
    gate.open()

    result = run.result()

    assert (result.outcome, result.write) == (RunOutcome.STOPPED, WriteResult.WRITTEN)
    assert _kinds(worker, job) == ["Claimed", "DeliveryEvidence", "Stopped"]
    assert worker.seed.row(job)["failure_reason"] is None


def test_with_every_session_slot_held_the_attempt_defers_briefly_and_the_circuit_learns_nothing(worker):
    worker.admin.execute("UPDATE destinations SET max_sessions = 1 WHERE id = %s", (worker.destination_id,))
    job = worker.queued()
    holder = worker.seed.conn   # another worker host's session, holding the only slot
    assert partner.try_slot(holder, destination_id=worker.destination_id, slot=0)
    with Database(worker.db_url, Role.APP, min_size=0, max_size=2, name="exports-slots") as slots_db:
        pool = SessionPool(DatabaseSlots(slots_db))
        runner = worker.runner(deferrals=POLICY, sessions=pool)

        busy = runner.run(job.id)

        assert busy.outcome is RunOutcome.DEFERRED
        row = worker.seed.row(job)
        assert row["last_deferral"].startswith("session limit:")
        assert (row["woken_at"] - row["deferred_since"]).total_seconds() <= 1.0
        assert not _circuit(worker, worker.destination_id).open
        assert pool.opened == 0 and worker.peer.files() == {}

        assert partner.release_slot(holder, destination_id=worker.destination_id, slot=0)
        assert runner.run(job.id).delivery is Status.COMPLETED
        # The warm session keeps its slot until it is closed.
        in_use = {s.id: s.sessions_in_use for s in partner.statuses(worker.conn, tenant_id=worker.tenant_id)}
        assert in_use[worker.destination_id] == 1
        pool.close()
        in_use = {s.id: s.sessions_in_use for s in partner.statuses(worker.conn, tenant_id=worker.tenant_id)}
        assert in_use[worker.destination_id] == 0


def test_a_worker_keeps_its_session_warm_between_deliveries_and_reopens_it_when_it_died(worker, fault_proxy):
    proxy, destination_id = _through_proxy(worker, fault_proxy)
    jobs = [worker.queued(destination_id) for _ in range(3)]
    pool = SessionPool()
    runner = worker.runner(deferrals=POLICY, sessions=pool)

    assert runner.run(jobs[0].id).delivery is Status.COMPLETED
    assert runner.run(jobs[1].id).delivery is Status.COMPLETED
    assert (pool.opened, pool.reused, proxy.connections_accepted) == (1, 1, 1)
    proxy.drop_all()   # the partner restarted: the warm session is dead
    assert runner.run(jobs[2].id).delivery is Status.COMPLETED

    assert (pool.opened, proxy.connections_accepted) == (2, 2)
    # Each delivery still took its own baseline, upload, rename and receipt.
    for job in jobs:
        stages = [json.loads(e["detail"])["stage"] for e in worker.seed.events(job) if e["kind"] == "DeliveryEvidence"]
        assert stages == ["baseline", "receipt", "outcome"]
    assert sorted(worker.peer.files()) == sorted(export.final_name(j.delivery_key) for j in jobs)


def test_a_database_blip_during_a_batch_of_builds_ends_with_every_export_completed(worker):
    jobs = [worker.queued() for _ in range(4)]
    retries_before = metrics.worker().build_retries._value.get()
    lock = _LockedContacts(worker.db_url)
    runners = [worker.runner(deferrals=POLICY) for _ in jobs]
    runs = [Background(lambda r=r, j=j: r.run(j.id)) for r, j in zip(runners, jobs, strict=True)]
    try:
        # Every build waits on the lock, by the database's own account; then the server terminates them.
        lock.wait_for_builders(worker.admin, len(jobs))
        terminated = worker.admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'exports-builder'").fetchone()["n"]
        assert terminated == len(jobs)
    finally:
        lock.release()
    results = [run.result(timeout=60) for run in runs]

    assert [r.delivery for r in results] == [Status.COMPLETED] * len(jobs)
    assert {worker.seed.row(j)["failure_reason"] for j in jobs} == {None}
    assert metrics.worker().build_retries._value.get() - retries_before == len(jobs)   # each on a fresh connection
    assert [worker.seed.row(j)["attempt_count"] for j in jobs] == [1] * len(jobs)
    assert sorted(worker.peer.files()) == sorted(export.final_name(j.delivery_key) for j in jobs)


class _LockedContacts:
    """Holds the contacts table locked so every build's COPY waits on it."""

    def __init__(self, db_url: str) -> None:
        self.conn = psycopg.connect(db_url, autocommit=False)
        self.conn.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")

    def wait_for_builders(self, admin, n: int) -> None:
        pid = self.conn.info.backend_pid
        wait_until(lambda: admin.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'exports-builder' AND %s = ANY(pg_blocking_pids(pid))",
            (pid,)).fetchone()["n"] == n, f"{n} builds to wait on the contacts lock", 30)

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()
