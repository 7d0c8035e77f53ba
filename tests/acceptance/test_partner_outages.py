"""The whole system (relay, workers, scheduler as real processes) against a real OpenSSH partner that goes
away for a while, or allows only a few sessions at once: every export ends Completed, each file is
delivered once, nothing ends Failed, and an outage costs about one build per export.

Each test prints its figures (``-s`` shows them): builds, connection attempts, deferrals, and for the
outage the time from the partner's return to the last Completed.
"""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest

from app.actors.deferral import CIRCUIT_OPEN, PROBE_FAILED
from app.store import export
from app.store.export import final_name
from app.store.types import Role
from exports_devtools.tcp_proxy import TcpProxy
from exports_devtools.waiting import wait_until
from tests.fixtures.processes import System

TENANT = "Initech"
OPERATOR = "alice"
#: Seconds the partner stays away: long enough for several probes at the short backoffs below.
OUTAGE_SECONDS = 20.0
#: Seconds the exports may take to complete once the partner is back (or, with few sessions, in all).
DEADLINE = 180.0
#: Short backoffs, so the minute-long outage of the scenario fits a test.
FAST_DEFERRALS = {"EXPORTS_DEFER_BASE_SECONDS": "0.5", "EXPORTS_DEFER_MAX_SECONDS": "3"}


def _set_up(system: System, peer, *, port: int, max_sessions: int) -> tuple[uuid.UUID, uuid.UUID]:
    tenant_id = system.cli("tenant", "add", TENANT, "--json").json["tenant_id"]
    system.cli("operator", "grant", "--operator", OPERATOR, "--tenant", TENANT)
    system.cli("contacts", "generate", "--tenant", TENANT, "--count", "200", "--seed", "1")
    key = peer.config.host_key.split(None, 1)[1]
    destination_id = system.cli(
        "destination", "add", "--no-check",
"--tenant", TENANT, "--name", "partner", "--host", "127.0.0.1", "--port", str(port),
        "--username", peer.config.username, "--remote-dir", peer.config.remote_dir, "--credential-ref",
        peer.config.credential_ref, "--host-key", f"[127.0.0.1]:{port} {key}", "--max-sessions", str(max_sessions),
        "--json").json["destination_id"]
    return uuid.UUID(tenant_id), uuid.UUID(destination_id)


def _create(conn, tenant_id: uuid.UUID, destination_id: uuid.UUID, n: int) -> list[uuid.UUID]:
    jobs = [uuid.uuid4() for _ in range(n)]
    for job_id in jobs:
        assert export.create(conn, job_id=job_id, tenant_id=tenant_id, destination_id=destination_id,
                             delivery_key=uuid.uuid4().hex, created_by=OPERATOR) is export.CreateResult.CREATED
    return jobs


def _statuses(admin, jobs) -> dict[str, int]:
    rows = admin.execute("SELECT status, count(*) AS n FROM export_jobs WHERE id = ANY(%s) GROUP BY status",
                         (jobs,)).fetchall()
    return {r["status"]: r["n"] for r in rows}


def _wait_completed(system: System, admin, jobs, timeout: float = DEADLINE) -> None:
    wait_until(lambda: _statuses(admin, jobs) == {"Completed": len(jobs)}, f"{len(jobs)} exports to complete",
               timeout, interval=0.2, diagnostics=lambda: f"{_statuses(admin, jobs)}\n{system.group.logs()}")


def _assert_each_delivered_once(admin, peer, jobs) -> None:
    rows = admin.execute("SELECT * FROM export_jobs WHERE id = ANY(%s)", (jobs,)).fetchall()
    files = peer.files()
    assert sorted(files) == sorted(final_name(r["delivery_key"]) for r in rows)   # no temporary file either
    for row in rows:
        assert hashlib.sha256(files[final_name(row["delivery_key"])]).digest() == bytes(row["expected_file_sha256"])
    finished = admin.execute("SELECT job_id, count(*) AS n FROM export_attempt_events WHERE job_id = ANY(%s)"
                             " AND kind = 'Finished' GROUP BY job_id", (jobs,)).fetchall()
    assert sorted(r["n"] for r in finished) == [1] * len(jobs)


def _figures(admin, jobs) -> dict[str, int]:
    """Claims, deferrals by cause, and builds: every claim builds except one the open circuit turned away
    and a probe that found the partner still down (it connects before it builds)."""
    events = admin.execute("SELECT kind, detail FROM export_attempt_events WHERE job_id = ANY(%s)"
                           " AND kind IN ('Claimed', 'DeferredPartnerUnavailable', 'RequeuedByRecovery')",
                           (jobs,)).fetchall()
    claims = sum(1 for e in events if e["kind"] == "Claimed")
    requeued = sum(1 for e in events if e["kind"] == "RequeuedByRecovery")
    deferred = [e["detail"] for e in events if e["kind"] == "DeferredPartnerUnavailable"]
    circuit_open = sum(1 for d in deferred if d == CIRCUIT_OPEN)
    probes_failed = sum(1 for d in deferred if d.startswith(PROBE_FAILED))
    session_limit = sum(1 for d in deferred if d.startswith("session limit"))
    return {"claims": claims, "deferrals": len(deferred), "circuit_open": circuit_open, "probes_failed": probes_failed,
            "session_limit": session_limit, "requeued_by_recovery": requeued,
            "unreachable": len(deferred) - circuit_open - probes_failed - session_limit,
            "builds": claims - circuit_open - probes_failed}


@pytest.mark.openssh
def test_a_partner_outage_during_a_batch_defers_every_export_and_all_complete_once_it_is_back(
        system, admin, connect_as, openssh_sftp):
    link = TcpProxy(openssh_sftp.config.port)
    try:
        system.group.env.update(openssh_sftp.environ, **FAST_DEFERRALS)
        system.start_relay()
        system.start_scheduler()
        tenant_id, destination_id = _set_up(system, openssh_sftp, port=link.port, max_sessions=4)
        jobs = _create(connect_as(Role.APP), tenant_id, destination_id, 20)
        # The partner goes away while the 20 exports wait in the queue; then the workers start.
        link.refuse_connections()
        outage_started = time.monotonic()
        system.start_worker()
        system.start_worker()
        deferred_each = lambda: admin.execute(   # noqa: E731
            "SELECT bool_and(deferrals > 0) AS all FROM export_jobs WHERE id = ANY(%s)", (jobs,)).fetchone()["all"]
        wait_until(lambda: time.monotonic() - outage_started >= OUTAGE_SECONDS and deferred_each(),
                   "the outage to last its time, every export deferred", OUTAGE_SECONDS + DEADLINE,
                   interval=0.2, diagnostics=system.group.logs)
        assert _statuses(admin, jobs).get("Failed", 0) == 0 and admin.execute(
            "SELECT state FROM destination_circuits WHERE destination_id = %s", (destination_id,)).fetchone()[
            "state"] == "open"
        returned_at = admin.execute("SELECT clock_timestamp() AS t").fetchone()["t"]
        link.accept_connections()

        _wait_completed(system, admin, jobs)
    finally:
        link.close()

    _assert_each_delivered_once(admin, openssh_sftp, jobs)
    figures = _figures(admin, jobs)
    last = admin.execute("SELECT max(recorded_at) AS t FROM export_attempt_events WHERE job_id = ANY(%s)"
                         " AND kind = 'Finished'", (jobs,)).fetchone()["t"]
    figures.update(connection_attempts=link.connections_accepted + link.connections_refused,
                   refused_during_outage=link.connections_refused)
    print(f"\noutage figures: {figures}, outage {OUTAGE_SECONDS:.0f} s, "
          f"return to last Completed {(last - returned_at).total_seconds():.1f} s")
    # About one build per export: the attempts already building when the partner went away, and no more.
    assert figures["builds"] <= len(jobs) + 4 + 2
    # A probe per backoff interval, not a connection per job per retry.
    assert link.connections_refused <= OUTAGE_SECONDS / 0.5
    assert (last - returned_at).total_seconds() < 60
    assert not admin.execute("SELECT state FROM destination_circuits WHERE destination_id = %s",
                             (destination_id,)).fetchone()["state"] == "open"


@pytest.mark.openssh
def test_thirty_simultaneous_exports_to_a_partner_with_few_sessions_all_complete_once(
        system, admin, connect_as, openssh_sftp_limited):
    peer = openssh_sftp_limited
    system.group.env.update(peer.environ, **FAST_DEFERRALS)
    system.start_relay()
    system.start_scheduler()
    # One more session than the partner's MaxStartups lets in at once: sometimes it drops one, and the
    # attempt defers rather than fails.
    tenant_id, destination_id = _set_up(system, peer, port=peer.config.port, max_sessions=3)
    jobs = _create(connect_as(Role.APP), tenant_id, destination_id, 30)
    for n in (1, 2):
        system.group.start(f"worker-{n}", "worker", "--processes", "1", "--threads", "6")

    _wait_completed(system, admin, jobs)

    _assert_each_delivered_once(admin, peer, jobs)
    figures = _figures(admin, jobs)
    print(f"\nfew-sessions figures: {figures}")
    assert _statuses(admin, jobs) == {"Completed": 30}
