"""Incremental exports, end to end on the real store, builder, runner and SFTP peer: an incremental schedule
over inserts, updates and withdrawn consent, with runs that end Completed, Failed and OutcomeUnknown,
delivers every change at least once, in order of runs; the watermark (the snapshot of the last Completed
run's build) never passes a change the partner has not received, even one whose transaction was still
open while a run built."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from app.actors.builder import ContactsBuilder
from app.actors.partner_file import Changes
from app.actors.policy import Scope
from app.actors.runner import RunOutcome
from app.actors.stop import StopSignal
from app.maintenance.cron import Cron
from app.maintenance.schedules import ScheduleConfig, Schedules
from app.store import export, schedule
from app.store import worker as worker_reads
from app.store.types import ExpectedFile, FailureCode, Status

START = datetime(2025, 6, 1, tzinfo=UTC)
CRON = Cron.parse("*/10 * * * *", "UTC")
#: Fields the partner keeps per contact, keyed by email (the CSV's columns, without _change).
FIELDS = ("email", "full_name", "company", "phone")


class Partner:
    """What the partner holds after applying, in order, each file that reached it."""

    def __init__(self) -> None:
        self.contacts: dict[str, tuple[str, ...]] = {}

    def apply(self, rows: list[dict[str, str]]) -> None:
        for row in rows:
            if row["_change"] == "delete":
                self.contacts.pop(row["email"], None)
            else:
                assert row["_change"] == "upsert"
                self.contacts[row["email"]] = tuple(row[f] for f in FIELDS)


def parse(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def consenting(admin, tenant_id) -> dict[str, tuple[str, ...]]:
    rows = admin.execute("SELECT email, full_name, company, phone FROM contacts WHERE tenant_id = %s AND consent",
                         (tenant_id,)).fetchall()
    return {r["email"]: tuple(r[f] or "" for f in FIELDS) for r in rows}


def watermark(conn, schedule_id) -> str | None:
    return schedule.read_hold(conn, schedule_id=schedule_id).watermark


def undelivered_past_the_watermark(admin, tenant_id, partner: Partner, mark: str | None) -> list[str]:
    """Contacts whose current state the partner lacks, although the watermark's snapshot could see the
    change: the next run would never send them."""
    rows = admin.execute(
        "SELECT email, full_name, company, phone, consent, consent_withdrawn_at IS NOT NULL AS withdrew,"
        " %s::pg_snapshot IS NOT NULL AND pg_visible_in_snapshot(changed_xid, %s::pg_snapshot) AS seen"
        " FROM contacts WHERE tenant_id = %s", (mark, mark, tenant_id)).fetchall()
    lost = []
    for r in rows:
        held = partner.contacts.get(r["email"])
        current = tuple(r[f] or "" for f in FIELDS) if r["consent"] else None
        if held != current and r["seen"] and (r["consent"] or r["withdrew"]):
            lost.append(r["email"])
    return lost


class Runs:
    """The schedule's slots, fired by the real service, and attempts driven by hand where a test needs an
    ending the partner cannot be asked for (Failed, OutcomeUnknown)."""

    def __init__(self, worker, schedule_id):
        self.worker = worker
        self.schedule_id = schedule_id
        self.service = Schedules(worker.db, ScheduleConfig(grace_seconds=3600))
        self.slot = 0

    def fire(self):
        counts = self.service.run_once(as_of=START + timedelta(minutes=10 * self.slot, seconds=1))
        self.slot += 1
        return counts

    def newest(self) -> dict:
        return self.worker.admin.execute("SELECT * FROM export_jobs WHERE schedule_id = %s ORDER BY created_at DESC"
                                         " LIMIT 1", (self.schedule_id,)).fetchone()

    def ended_by_hand(self, job: dict, outcome: Status, failure_reason: FailureCode | None = None):
        """Claim, build (the real builder), cutoff 2 with the snapshot, and the terminal write, uploading
        nothing. Answers the attempt and the rows the file holds."""
        conn, attempt_id = self.worker.conn, uuid.uuid4()
        assert export.try_claim(conn, job_id=job["id"], checked_version=1, attempt_id=attempt_id, worker_id="by-hand",
                                lease_seconds=60) == 1
        view = worker_reads.read_job(conn, job["id"])
        builder = ContactsBuilder(self.worker.db_url, self.worker.work_dir)
        try:
            built = builder.build(job_id=job["id"], attempt_id=attempt_id, tenant_id=job["tenant_id"],
                                  scope=Scope.CONSENTING_CONTACTS, stop=StopSignal(),
                                  changes=Changes(view.incremental_since))
        finally:
            builder.close()
        rows = parse(built.path.read_bytes())
        built.delete()
        assert export.try_authorize_delivery(conn, job_id=job["id"], tenant_id=job["tenant_id"], attempt_id=attempt_id,
                                             expected=ExpectedFile(view.file_name, built.size, built.sha256,
                                                                   snapshot=built.snapshot),
                                             replaces_job_id=None) == 1
        assert export.try_finish_delivery(conn, job_id=job["id"], attempt_id=attempt_id, worker_id="by-hand",
                                          outcome=outcome, failure_reason=failure_reason) == 1
        return attempt_id, rows

    def delivered(self, job: dict) -> list[dict[str, str]]:
        """The real runner delivers the job to the peer; answers the rows of the file the partner got."""
        result = self.worker.runner().run(job["id"])
        assert (result.outcome, result.delivery) == (RunOutcome.DELIVERED, Status.COMPLETED)
        name = self.worker.admin.execute("SELECT expected_file_name FROM export_jobs WHERE id = %s",
                                         (job["id"],)).fetchone()["expected_file_name"]
        return parse(self.worker.peer.files()[name])


def test_an_incremental_schedule_delivers_every_change_at_least_once_in_order_and_never_moves_past_one(
        worker, db_url):
    admin, conn, tenant_id = worker.admin, worker.conn, worker.tenant_id
    schedule_id = uuid.uuid4()
    assert schedule.add(conn, schedule_id=schedule_id, tenant_id=tenant_id, destination_id=worker.destination_id,
                        cron=CRON.expression, time_zone="UTC", incremental=True,
                        next_fire_at=CRON.first_at_or_after(START), changed_by="op-1") is schedule.AddResult.ADDED
    runs, partner = Runs(worker, schedule_id), Partner()

    def crm(sql: str, *params) -> None:   # the CRM's own writes, as the schema's owner
        admin.execute(sql, params)

    # Run 1, the first: every consenting contact, each an upsert; Completed.
    runs.fire()
    first = runs.newest()
    assert first["incremental"] and first["incremental_since"] is None
    rows = runs.delivered(first)
    assert len(rows) == 25 and {r["_change"] for r in rows} == {"upsert"}
    partner.apply(rows)
    assert partner.contacts == consenting(admin, tenant_id)
    first_mark = watermark(conn, schedule_id)
    assert first_mark == admin.execute("SELECT expected_snapshot::text AS s FROM export_jobs WHERE id = %s",
                                       (first["id"],)).fetchone()["s"] is not None

    # An update, an insert, a withdrawal, and a contact who never consented.
    crm("UPDATE contacts SET company = 'Moved Ltd' WHERE tenant_id = %s AND email = 'c1@example.com'", tenant_id)
    crm("INSERT INTO contacts (tenant_id, email, full_name, consent) VALUES (%s, 'new1@example.com', 'New 1', true)",
        tenant_id)
    crm("UPDATE contacts SET consent = false WHERE tenant_id = %s AND email = 'c2@example.com'", tenant_id)
    crm("INSERT INTO contacts (tenant_id, email, full_name, consent) VALUES (%s, 'z@example.com', 'Z', false)",
        tenant_id)

    # Run 2 ends Failed: nothing reached the partner, and the watermark stays where it was.
    runs.fire()
    _, rows = runs.ended_by_hand(runs.newest(), Status.FAILED, FailureCode.NOT_DELIVERED)
    assert sorted((r["email"], r["_change"]) for r in rows) == [
        ("c1@example.com", "upsert"), ("c2@example.com", "delete"), ("new1@example.com", "upsert")]
    assert watermark(conn, schedule_id) == first_mark
    assert undelivered_past_the_watermark(admin, tenant_id, partner, first_mark) == []

    # Run 3 ends OutcomeUnknown (its file did reach the partner): the next slot is held until it is settled.
    crm("INSERT INTO contacts (tenant_id, email, full_name, consent) VALUES (%s, 'new2@example.com', 'New 2', true)",
        tenant_id)
    runs.fire()
    third = runs.newest()
    assert third["incremental_since"] == first_mark   # the Failed run moved nothing
    attempt, rows = runs.ended_by_hand(third, Status.OUTCOME_UNKNOWN)
    assert {r["email"] for r in rows} == {"c1@example.com", "c2@example.com", "new1@example.com", "new2@example.com"}
    partner.apply(rows)
    assert runs.fire().held == 1
    assert watermark(conn, schedule_id) == first_mark
    assert undelivered_past_the_watermark(admin, tenant_id, partner, first_mark) == []
    assert export.reconcile(conn, tenant_id=tenant_id, job_id=third["id"], attempt_id=attempt,
                            resolution=Status.COMPLETED, evidence="the partner has the file", reconciled_by="op-1")
    third_mark = watermark(conn, schedule_id)
    assert third_mark != first_mark

    # Released, run 4 builds while a CRM transaction that changes c3 is still open: it cannot see it.
    with psycopg.connect(db_url) as crm_tx:
        crm_tx.execute("UPDATE contacts SET company = 'Late Co' WHERE tenant_id = %s AND email = 'c3@example.com'",
                       (tenant_id,))
        assert runs.service.run_once(as_of=START + timedelta(minutes=31)).released == 1
        fourth = runs.newest()
        assert fourth["incremental_since"] == third_mark
        rows = runs.delivered(fourth)
        assert rows == []   # nothing committed changed since run 3's snapshot
        partner.apply(rows)
        fourth_mark = watermark(conn, schedule_id)
        crm_tx.commit()   # committed after run 4's snapshot was taken
    assert partner.contacts["c3@example.com"][2] == "Acme, Inc."
    assert undelivered_past_the_watermark(admin, tenant_id, partner, fourth_mark) == []   # c3 is not past it

    # Run 5 sends c3's late change; the partner now holds exactly the consenting contacts.
    runs.fire()
    rows = runs.delivered(runs.newest())
    assert [(r["email"], r["company"], r["_change"]) for r in rows] == [("c3@example.com", "Late Co", "upsert")]
    partner.apply(rows)
    assert partner.contacts == consenting(admin, tenant_id)
    assert "c2@example.com" not in partner.contacts and "z@example.com" not in partner.contacts
    assert undelivered_past_the_watermark(admin, tenant_id, partner, watermark(conn, schedule_id)) == []
