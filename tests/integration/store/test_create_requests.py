"""Creates that can be retried (`naming.submit_create`, `creation.submit_replacement`): the request is
recorded with the export in one transaction; the same id with the same terms answers that export (a
replay), with other terms RequestIdReused; a lock timeout is Busy with nothing written; a lost commit reply
is settled by reading the request back. Interleavings are forced with the fault proxy and held
transactions, confirmed with pg_blocking_pids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from app.delivery import naming
from app.store import connector, creation
from app.store.creation import CreateReply
from app.store.database import connect
from app.store.types import Role, Status
from tests.support import wait_until_blocked

#: Long enough that a waiting statement in these tests never times out unless a test means it to.
PATIENT = "30s"


class Connector:
    """``creation.Connect`` over a URL (the database's, or the proxy's), remembering each connection's
    backend so a test can see it wait."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.backends: list[int] = []

    @contextmanager
    def __call__(self) -> Iterator[psycopg.Connection]:
        conn = connect(self.url, Role.APP)
        self.backends.append(conn.info.backend_pid)
        try:
            yield conn
        finally:
            conn.close()


def submit(connector_: Connector, tenant_id, destination_id, request_id, *, by="op-1", lock_timeout=PATIENT):
    return naming.submit_create(connector_, tenant_id=tenant_id, destination_id=destination_id, requested_by=by,
                                request_id=request_id, lock_timeout=lock_timeout)


def exports(admin, tenant_id) -> list[dict]:
    return admin.execute("SELECT * FROM export_jobs WHERE tenant_id = %s ORDER BY created_at", (tenant_id,)).fetchall()


def requests(admin, tenant_id) -> list[dict]:
    return admin.execute("SELECT * FROM create_requests WHERE tenant_id = %s", (tenant_id,)).fetchall()


@pytest.fixture
def direct(db_url) -> Connector:
    return Connector(db_url)


@pytest.fixture
def tenant(seed):
    tenant_id = seed.tenant()
    return tenant_id, seed.destination(tenant_id)


# --- replays and reuse -----------------------------------------------------------------------------


def test_a_create_records_its_request_with_the_export_and_the_same_request_again_is_a_replay(
        direct, admin, tenant):
    tenant_id, destination_id = tenant
    request_id = uuid.uuid4()

    first = submit(direct, tenant_id, destination_id, request_id)
    again = submit(direct, tenant_id, destination_id, request_id)

    assert first.reply is CreateReply.CREATED and first.replay_of is None
    assert again.reply is CreateReply.CREATED and again.replay_of is not None
    assert (again.job_id, again.delivery_key, again.file_name) == (first.job_id, first.delivery_key, first.file_name)
    [job] = exports(admin, tenant_id)
    assert job["id"] == first.job_id and job["status"] == Status.QUEUED and job["created_by"] == "op-1"
    [request] = requests(admin, tenant_id)
    assert (request["id"], request["job_id"], request["kind"], request["destination_id"]) == (
        request_id, first.job_id, "Create", destination_id)
    assert len(admin.execute("SELECT * FROM outbox WHERE job_id = %s", (first.job_id,)).fetchall()) == 1


def test_a_request_id_reused_for_another_destination_or_by_another_operator_is_refused_and_writes_nothing(
        direct, admin, seed, tenant):
    tenant_id, destination_id = tenant
    other_destination = seed.destination(tenant_id)
    request_id = uuid.uuid4()
    first = submit(direct, tenant_id, destination_id, request_id)

    elsewhere = submit(direct, tenant_id, other_destination, request_id)
    by_another = submit(direct, tenant_id, destination_id, request_id, by="op-2")

    assert elsewhere.reply is by_another.reply is CreateReply.REQUEST_ID_REUSED
    assert elsewhere.job_id is None and by_another.job_id is None
    assert [j["id"] for j in exports(admin, tenant_id)] == [first.job_id]
    assert len(requests(admin, tenant_id)) == 1


def test_the_same_request_id_in_another_tenant_is_a_different_request(direct, admin, seed, tenant):
    tenant_id, destination_id = tenant
    other_tenant = seed.tenant("Other")
    request_id = uuid.uuid4()

    first = submit(direct, tenant_id, destination_id, request_id)
    other = submit(direct, other_tenant, seed.destination(other_tenant), request_id)

    assert first.reply is other.reply is CreateReply.CREATED and other.replay_of is None
    assert first.job_id != other.job_id
    assert len(exports(admin, other_tenant)) == 1


def test_a_create_for_another_tenants_destination_records_nothing(direct, admin, seed, tenant):
    tenant_id, _ = tenant
    elsewhere = seed.destination(seed.tenant("Other"))

    answer = submit(direct, tenant_id, elsewhere, uuid.uuid4())

    assert answer.reply is CreateReply.UNKNOWN_DESTINATION
    assert exports(admin, tenant_id) == [] and requests(admin, tenant_id) == []


# --- the double click ------------------------------------------------------------------------------


def test_two_submissions_of_one_click_at_once_create_one_export_and_get_the_same_answer(
        pg_proxy, direct, admin, tenant, threads):
    tenant_id, destination_id = tenant
    request_id = uuid.uuid4()
    # The first submission stops after its export's statement, inside its transaction: it holds the request
    # id's key, uncommitted.
    hold = pg_proxy.hold_statement("export_create", after_reply=True)
    through_proxy = Connector(pg_proxy.url)
    first = threads.submit(submit, through_proxy, tenant_id, destination_id, request_id)
    assert hold.reached.wait(60)

    # The second finds no committed request and waits on the key the first holds.
    second = threads.submit(submit, direct, tenant_id, destination_id, request_id)
    wait_until_blocked(admin, _waiting_backend(direct), by=through_proxy.backends[0])
    hold.release()
    answers = [first.result(timeout=10), second.result(timeout=10)]

    assert [a.reply for a in answers] == [CreateReply.CREATED] * 2
    assert answers[0].job_id == answers[1].job_id
    assert answers[0].replay_of is None and answers[1].replay_of is not None   # the second says it is a replay
    assert [j["id"] for j in exports(admin, tenant_id)] == [answers[0].job_id]
    assert len(requests(admin, tenant_id)) == 1


def _waiting_backend(connector_: Connector) -> int:
    from exports_devtools.waiting import wait_until

    return wait_until(lambda: connector_.backends[-1] if connector_.backends else None, "a connection", 10)


# --- busy --------------------------------------------------------------------------------------------


def test_a_create_that_outwaits_lock_timeout_is_busy_writes_nothing_and_succeeds_on_retry(
        connect_as, direct, admin, tenant):
    tenant_id, destination_id = tenant
    request_id = uuid.uuid4()
    # Another transaction holds the request id's key, uncommitted (then rolls back).
    holder = connect_as(Role.APP, autocommit=False)
    holder.execute(connector.text("creation_record_request"), dict(
        tenant_id=tenant_id, request_id=request_id, kind="Create", job_id=uuid.uuid4(), requested_by="op-1",
        destination_id=destination_id, original_job_id=None, overwrite_agreement_ref=None))

    busy = submit(direct, tenant_id, destination_id, request_id, lock_timeout="200ms")

    assert busy.reply is CreateReply.BUSY and busy.job_id is None
    holder.rollback()
    assert exports(admin, tenant_id) == [] and requests(admin, tenant_id) == []

    retried = submit(direct, tenant_id, destination_id, request_id, lock_timeout="200ms")

    assert retried.reply is CreateReply.CREATED and retried.replay_of is None
    assert [j["id"] for j in exports(admin, tenant_id)] == [retried.job_id]


# --- lost replies ------------------------------------------------------------------------------------


def test_a_create_whose_commit_reply_is_lost_is_settled_from_the_request_and_leaves_one_export(
        pg_proxy, direct, admin, tenant):
    tenant_id, destination_id = tenant
    request_id = uuid.uuid4()
    cut = pg_proxy.cut_at_commit("creation_record_request")

    answer = submit(Connector(pg_proxy.url), tenant_id, destination_id, request_id)

    cut.wait()
    # The commit happened; the read-back says so, and it is this submission's own export, not a replay.
    assert answer.reply is CreateReply.CREATED and answer.replay_of is None
    [job] = exports(admin, tenant_id)
    assert job["id"] == answer.job_id

    # The operator, who saw nothing, retries with the same id: the same export, as a replay.
    retried = submit(direct, tenant_id, destination_id, request_id)
    assert retried.job_id == answer.job_id and retried.replay_of is not None
    assert len(exports(admin, tenant_id)) == 1


def test_a_create_whose_commit_never_reached_the_database_is_run_again_once_and_leaves_one_export(
        pg_proxy, admin, tenant):
    tenant_id, destination_id = tenant
    cut = pg_proxy.cut_at_commit("creation_record_request", after_reply=False)

    answer = submit(Connector(pg_proxy.url), tenant_id, destination_id, uuid.uuid4())

    cut.wait()
    assert answer.reply is CreateReply.CREATED and answer.replay_of is None
    assert [j["id"] for j in exports(admin, tenant_id)] == [answer.job_id]


def test_a_lost_commit_reply_with_the_database_unreachable_is_unknown_and_a_retry_answers_what_was_recorded(
        pg_proxy, direct, admin, tenant):
    tenant_id, destination_id = tenant
    request_id = uuid.uuid4()
    cut = pg_proxy.cut_at_commit("creation_record_request", then_refuse=True)

    answer = submit(Connector(pg_proxy.url), tenant_id, destination_id, request_id)

    cut.wait()
    assert answer.reply is CreateReply.UNKNOWN and answer.job_id is None
    [job] = exports(admin, tenant_id)   # it did commit
    retried = submit(direct, tenant_id, destination_id, request_id)
    assert retried.reply is CreateReply.CREATED and retried.job_id == job["id"] and retried.replay_of is not None


# --- replace -----------------------------------------------------------------------------------------


def test_a_replacement_under_a_request_id_is_created_once_and_other_terms_are_refused(direct, admin, seed):
    original = seed.finished(Status.OUTCOME_UNKNOWN)
    request_id = uuid.uuid4()

    def replace(overwrite=None, reason="partner lost it"):
        return creation.submit_replacement(direct, tenant_id=original.tenant_id, request_id=request_id,
                                           job_id=uuid.uuid4(), original_job_id=original.id, requested_by="op-1",
                                           replacement_reason=reason, overwrite_agreement_ref=overwrite)

    first = replace()
    again = replace(reason="a different reason")
    other_terms = replace(overwrite="ticket-9")

    assert first.reply is again.reply is CreateReply.CREATED and again.replay_of is not None
    assert again.job_id == first.job_id and first.delivery_key == original.delivery_key
    assert other_terms.reply is CreateReply.REQUEST_ID_REUSED
    replacements = admin.execute("SELECT * FROM export_jobs WHERE replaces_job_id = %s", (original.id,)).fetchall()
    assert [(r["id"], r["replacement_reason"]) for r in replacements] == [(first.job_id, "partner lost it")]


def test_a_replacement_that_is_not_allowed_records_no_request(direct, admin, seed):
    running = seed.running()

    answer = creation.submit_replacement(direct, tenant_id=running.tenant_id, request_id=uuid.uuid4(),
                                         job_id=uuid.uuid4(), original_job_id=running.id, requested_by="op-1",
                                         replacement_reason="why not")

    assert answer.reply is CreateReply.NOT_ALLOWED
    assert requests(admin, running.tenant_id) == []
