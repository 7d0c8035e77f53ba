"""Each destination's circuit and session slots, in the database every worker host shares."""

from __future__ import annotations

import uuid

from app.store import export, partner
from app.store.database import connect
from app.store.types import Role
from exports_devtools.waiting import wait_until

BASE, CAP = 2.0, 30.0


def _fail(conn, destination_id, attempt_id=None, error="connecting: ConnectionRefusedError: refused"):
    return partner.record_failure(conn, destination_id=destination_id, attempt_id=attempt_id or uuid.uuid4(),
                                  error=error, base_seconds=BASE, max_seconds=CAP)


def _probe_due(admin, destination_id):
    """Time travel: the next probe's time has come."""
    admin.execute("UPDATE destination_circuits SET next_probe_at = clock_timestamp() - interval '1 second'"
                  " WHERE destination_id = %s", (destination_id,))


def test_a_destination_without_a_circuit_row_reads_as_closed(seed, conn):
    destination = seed.destination(seed.tenant())

    assert partner.read_circuit(conn, destination_id=destination) == partner.Circuit.closed()


def test_a_connection_failure_opens_the_circuit_with_its_first_probe_a_base_backoff_away(seed, conn):
    destination = seed.destination(seed.tenant())

    failure = _fail(conn, destination)

    circuit = partner.read_circuit(conn, destination_id=destination)
    assert failure.opened and failure.failures == 1
    assert circuit.open and not circuit.probe_held and circuit.last_error.startswith("connecting:")
    assert BASE - 0.5 <= circuit.probe_in_seconds <= BASE


def test_failures_of_attempts_that_started_before_it_opened_do_not_push_the_probe_away(seed, conn):
    destination = seed.destination(seed.tenant())
    first = _fail(conn, destination)

    later = [_fail(conn, destination, error=f"late {n}") for n in range(5)]

    assert [f.opened for f in later] == [False] * 5
    assert {f.next_probe_at for f in later} == {first.next_probe_at} and later[-1].failures == 1
    assert partner.read_circuit(conn, destination_id=destination).last_error == "late 4"


def test_one_attempt_claims_a_due_probe_and_a_failed_probe_reopens_the_circuit_with_a_longer_backoff(
        seed, conn, admin):
    destination = seed.destination(seed.tenant())
    _fail(conn, destination)
    probe, other = uuid.uuid4(), uuid.uuid4()
    assert not partner.claim_probe(conn, destination_id=destination, attempt_id=probe, probe_seconds=60)
    _probe_due(admin, destination)

    assert partner.claim_probe(conn, destination_id=destination, attempt_id=probe, probe_seconds=60)
    assert not partner.claim_probe(conn, destination_id=destination, attempt_id=other, probe_seconds=60)
    assert partner.read_circuit(conn, destination_id=destination).probe_held

    failure = _fail(conn, destination, attempt_id=probe)

    circuit = partner.read_circuit(conn, destination_id=destination)
    assert (failure.opened, failure.failures, circuit.probe_held) == (False, 2, False)
    assert 2 * BASE - 0.5 <= circuit.probe_in_seconds <= 2 * BASE


def test_the_probe_backoff_is_capped(seed, conn, admin):
    destination = seed.destination(seed.tenant())
    _fail(conn, destination)
    for _ in range(8):
        _probe_due(admin, destination)
        probe = uuid.uuid4()
        assert partner.claim_probe(conn, destination_id=destination, attempt_id=probe, probe_seconds=60)
        _fail(conn, destination, attempt_id=probe)

    assert CAP - 0.5 <= partner.read_circuit(conn, destination_id=destination).probe_in_seconds <= CAP


def test_a_probe_whose_attempt_vanished_can_be_claimed_again_once_its_claim_runs_out(seed, conn, admin):
    destination = seed.destination(seed.tenant())
    _fail(conn, destination)
    _probe_due(admin, destination)
    assert partner.claim_probe(conn, destination_id=destination, attempt_id=uuid.uuid4(), probe_seconds=60)
    admin.execute("UPDATE destination_circuits SET probe_until = clock_timestamp() - interval '1 second'"
                  " WHERE destination_id = %s", (destination,))

    assert partner.claim_probe(conn, destination_id=destination, attempt_id=uuid.uuid4(), probe_seconds=60)


def test_a_connection_closes_the_circuit_and_the_next_failure_opens_it_afresh(seed, conn, admin):
    destination = seed.destination(seed.tenant())
    _fail(conn, destination)
    _probe_due(admin, destination)
    probe = uuid.uuid4()
    partner.claim_probe(conn, destination_id=destination, attempt_id=probe, probe_seconds=60)
    _fail(conn, destination, attempt_id=probe)

    assert partner.close_circuit(conn, destination_id=destination)
    assert not partner.close_circuit(conn, destination_id=destination)   # already closed: nothing to do
    assert not partner.read_circuit(conn, destination_id=destination).open
    again = _fail(conn, destination)
    assert (again.opened, again.failures) == (True, 1)


def test_a_destinations_slots_are_held_by_one_session_each_and_freed_with_it(seed, db_url):
    destination = seed.destination(seed.tenant())
    first, second = connect(db_url, Role.APP), connect(db_url, Role.APP)
    try:
        assert partner.try_slot(first, destination_id=destination, slot=0)
        assert not partner.try_slot(second, destination_id=destination, slot=0)
        assert partner.try_slot(second, destination_id=destination, slot=1)
        assert partner.try_slot(second, destination_id=seed.destination(seed.tenant()), slot=0)   # another's

        assert partner.release_slot(first, destination_id=destination, slot=0)
        assert not partner.release_slot(first, destination_id=destination, slot=0)
        assert partner.try_slot(second, destination_id=destination, slot=0)
    finally:
        second.close()
    # A session that ends (a dead worker) frees every slot it held, once its backend has exited.
    wait_until(lambda: partner.try_slot(first, destination_id=destination, slot=1), "the closed session's slot", 10)
    first.close()


def test_the_status_shows_each_destinations_circuit_sessions_in_use_and_deferred_jobs(seed, conn, db_url):
    tenant = seed.tenant("Status")
    quiet, failing = seed.destination(tenant), seed.destination(tenant)
    other_tenant = seed.destination(seed.tenant("Other"))
    _fail(conn, failing, error="connecting: EOFError")
    deferred = seed.running(seed.queued(tenant, failing))
    assert export.try_defer(conn, job_id=deferred.id, attempt_id=deferred.attempt_id, worker_id="w",
                            cause="connecting: EOFError", delay_seconds=60) == 1
    holder = connect(db_url, Role.APP)
    try:
        assert partner.try_slot(holder, destination_id=failing, slot=0)
        assert partner.try_slot(holder, destination_id=failing, slot=3)

        found = {s.id: s for s in partner.statuses(conn, tenant_id=tenant)}
    finally:
        holder.close()

    assert set(found) == {quiet, failing} and other_tenant not in found
    assert (found[quiet].state, found[quiet].sessions_in_use, found[quiet].deferred_jobs) == ("closed", 0, 0)
    assert (found[failing].state, found[failing].sessions_in_use, found[failing].deferred_jobs) == ("open", 2, 1)
    assert (found[failing].last_error, found[failing].max_sessions, found[failing].auto_retries) == (
        "connecting: EOFError", 4, 3)
    assert len(partner.statuses(conn)) == 3
