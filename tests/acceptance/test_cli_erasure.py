"""``exports contacts erase``: a person's contacts leave the tenant, so no later file carries them; the
erasure is recorded without the address; and the answer says where the address may already be."""

from __future__ import annotations

import pytest
from psycopg import errors as pg

from app.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND
from app.store import directory
from app.store.directory import NewContact
from app.store.types import Status
from tests.acceptance.test_cli import one_line_error, snapshot

ADDRESS = "Ann.Smith@Example.com"


def _contact(email: str, consent: bool = True) -> NewContact:
    return NewContact(email=email, full_name="Ann Smith", company="Initech", phone="+1 555 0100", consent=consent)


@pytest.fixture
def initech(seed, conn, admin):
    """Initech with Ann (consenting) and Bob; two destinations, 'partner' with two delivered exports and one
    building now, 'archive' with none; and Globex, whose contact has Ann's address too."""
    tenant_id = seed.tenant("Initech")
    partner = seed.destination(tenant_id)
    archive = seed.destination(tenant_id)
    admin.execute("UPDATE destinations SET name = 'archive', host = 'archive.example' WHERE id = %s", (archive,))
    directory.copy_contacts(conn, tenant_id=tenant_id, contacts=[_contact(ADDRESS), _contact("bob@example.com")])
    globex = seed.tenant("Globex")
    directory.copy_contacts(conn, tenant_id=globex, contacts=[_contact(ADDRESS)])
    for _ in range(2):
        seed.finished(Status.COMPLETED, seed.queued(tenant_id, partner))
    seed.running(seed.queued(tenant_id, partner))
    return tenant_id


def _emails(admin, tenant_name: str) -> list[str]:
    return [r["email"] for r in admin.execute(
        "SELECT c.email FROM contacts c JOIN tenants t ON t.id = c.tenant_id WHERE t.name = %s ORDER BY c.id",
        (tenant_name,)).fetchall()]


def test_erasing_an_address_deletes_the_tenants_contacts_of_it_and_records_the_erasure_without_it(
        exports_cli, admin, initech):
    erased = exports_cli("contacts", "erase", "--tenant", "Initech", "--email", "ann.smith@EXAMPLE.com",
                         "--by", "dpo", "--reason", "ticket 4711", "--json").json

    assert (erased["result"], erased["contacts"], erased["rows_known"]) == ("Erased", 1, False)
    assert _emails(admin, "Initech") == ["bob@example.com"]
    assert _emails(admin, "Globex") == [ADDRESS]   # another tenant's contact is its own
    [record] = admin.execute("SELECT * FROM contact_erasures").fetchall()
    assert (record["id"], record["erased_by"], record["reason"], record["contacts_erased"]) == (
        erased["erasure_id"], "dpo", "ticket 4711", 1)
    assert "ann" not in str(record).lower()


def test_an_erasure_says_which_destinations_may_hold_the_address_since_files_record_no_rows(
        exports_cli, initech):
    text = exports_cli("contacts", "erase", "--tenant", "Initech", "--email", ADDRESS).stdout
    answer = exports_cli("contacts", "erase", "--tenant", "Initech", "--email", ADDRESS, "--dry-run", "--json").json

    assert "cannot be known" in text and "ask each partner to delete it" in text
    assert answer["result"] == "NothingToErase"   # erased a moment ago: an erasure is idempotent


def test_a_dry_run_lists_the_destinations_and_erases_nothing(exports_cli, admin, initech):
    before = snapshot(admin)

    answer = exports_cli("contacts", "erase", "--tenant", "Initech", "--email", ADDRESS, "--dry-run", "--json").json

    assert snapshot(admin) == before
    assert admin.execute("SELECT count(*) AS n FROM contact_erasures").fetchone()["n"] == 0
    assert (answer["result"], answer["contacts"]) == ("DryRun", 1)
    [partner] = answer["may_be_at"]   # 'archive' received nothing
    assert (partner["destination"], partner["delivered"], partner["in_flight"], partner["undetermined"]) == (
        "partner", 2, 1, 0)
    assert partner["first_delivered"] <= partner["last_delivered"]


def test_a_contact_that_never_consented_was_never_in_a_file_and_the_answer_says_so(exports_cli, conn, initech):
    directory.copy_contacts(conn, tenant_id=initech, contacts=[_contact("carol@example.com", consent=False)])
    args = ("contacts", "erase", "--tenant", "Initech", "--email", "carol@example.com")

    text = exports_cli(*args, "--dry-run").stdout
    answer = exports_cli(*args, "--json").json

    assert "never consented, so never in an exported file" in text
    assert (answer["result"], answer["ever_consented"], answer["may_be_at"]) == ("Erased", False, [])


def test_an_erased_contact_is_in_no_later_file(exports_cli, initech):
    before = exports_cli("preview", "--tenant", "Initech", "--destination", "partner").stdout
    exports_cli("contacts", "erase", "--tenant", "Initech", "--email", ADDRESS)
    after = exports_cli("preview", "--tenant", "Initech", "--destination", "partner").stdout

    assert ADDRESS in before and ADDRESS not in after and "bob@example.com" in after


@pytest.mark.parametrize("argv, code", [
    (("--tenant", "Nobody", "--email", ADDRESS), EXIT_NOT_FOUND),
    (("--tenant", "Initech", "--email", "ann\x01@example.com"), EXIT_BAD_INPUT),
    (("--tenant", "Initech", "--email", "a" * 321), EXIT_BAD_INPUT),
    (("--tenant", "Initech"), EXIT_BAD_INPUT),
])
def test_bad_input_to_an_erasure_is_one_line_and_erases_nothing(exports_cli, admin, initech, argv, code):
    before = snapshot(admin)

    one_line_error(exports_cli("contacts", "erase", *argv, expect=code))

    assert snapshot(admin) == before


def test_no_one_rewrites_or_removes_an_erasure_record_not_even_the_owner(exports_cli, admin, conn, initech):
    exports_cli("contacts", "erase", "--tenant", "Initech", "--email", ADDRESS)

    for statement in ("UPDATE contact_erasures SET erased_by = 'x'", "DELETE FROM contact_erasures",
                      "TRUNCATE contact_erasures"):
        with pytest.raises(pg.InsufficientPrivilege, match="permission denied"):
            conn.execute(statement)
        with pytest.raises(pg.InsufficientPrivilege, match="append-only"):
            admin.execute(statement)
    assert admin.execute("SELECT count(*) AS n FROM contact_erasures").fetchone()["n"] == 1
