"""What the partner receives, through the real system (relay, worker) to a real OpenSSH server: for each
delivery profile option, the file on the partner, decompressed and parsed by an independent reader
(Python's ``csv``, ``json``), equals the tenant's consenting contacts field for field, hostile values
included; the file name is the profile's template rendered when the export was created; the profile
version the file was built with is on record; and ``exports preview`` prints the file's first rows.

The expected files are computed here from the contacts the test imported, not from the system's output.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import paramiko
import pytest
from psycopg.types.json import Jsonb

from exports_devtools.waiting import wait_until
from tests.acceptance.steps import DEADLINE, OPERATOR, TENANT, builder_blocked_by, hold_builds, job_row, wait_status
from tests.fixtures.openpgp import gpg, make_party, stop_agents
from tests.fixtures.processes import System
from tests.support import unavailable

#: Values a partner's parser trips on: quotes, delimiters of every kind, line breaks, emoji, right-to-left
#: text, cells a spreadsheet would evaluate, and an empty optional field. None starts or ends with
#: whitespace, which ``contacts import`` trims (a cell that starts with a tab or CR is neutralised too:
#: tests/integration/store/test_worker_copy.py puts one in directly).
HOSTILE = [
    {"email": "quote@example.com", "full_name": 'Say "hi"', "company": '"Quoted" Co', "phone": "",
     "tier": "gold", "Lead Source (2024)": "web"},
    {"email": "delims@example.com", "full_name": "Last, First; Middle|Tab\there", "company": "Acme, Inc.",
     "phone": "1,2", "tier": "", "Lead Source (2024)": "fair; booth 7"},
    {"email": "lines@example.com", "full_name": "Line one\nLine two", "company": "CR\r\nLF", "phone": "555",
     "tier": "silver", "Lead Source (2024)": ""},
    {"email": "emoji@example.com", "full_name": "Zoë 👩🏽‍💻 Ångström", "company": "山田商事 ✓", "phone": "☎ 555",
     "tier": "🥇", "Lead Source (2024)": "referral"},
    {"email": "rtl@example.com", "full_name": "שלום עליכם", "company": "شركة \u202eevil\u202c", "phone": "",
     "tier": "bronze", "Lead Source (2024)": "مؤتمر"},
    {"email": "formula@example.com", "full_name": "=HYPERLINK(\"http://x\",\"click\")", "company": "+cmd|' /C calc'!A0",
     "phone": "-2+3", "tier": "@SUM(A1:A2)", "Lead Source (2024)": "=1+1"},
    {"email": "backslash@example.com", "full_name": "back\\slash", "company": "\\.", "phone": "spa ced",
     "tier": "x", "Lead Source (2024)": "\\N"},
]
#: Contacts without consent: never in any file.
REFUSED = [{"email": "no-consent@example.com", "full_name": "Not Me", "company": "", "phone": "", "tier": "gold",
            "Lead Source (2024)": "web"}]
#: Enough ordinary contacts that a file spans several of the builder's chunks.
ORDINARY = 3000
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _contacts() -> list[dict[str, str]]:
    ordinary = [{"email": f"c{i:05d}@example.com", "full_name": f"Contact {i}", "company": f"Company {i % 17}",
                 "phone": f"+1-555-{i:04d}", "tier": ("gold", "silver", "")[i % 3], "Lead Source (2024)": "list"}
                for i in range(ORDINARY)]
    return HOSTILE + ordinary


def _import(system: System, tmp_path: Path) -> list[dict[str, str]]:
    contacts = _contacts()
    path = tmp_path / "contacts.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["email", "full_name", "company", "phone", "consent", "tier",
                                         "Lead Source (2024)"])
        writer.writeheader()
        for contact in contacts:
            writer.writerow({**contact, "consent": "yes"})
        for contact in REFUSED:
            writer.writerow({**contact, "consent": "no"})
    system.cli("contacts", "import", str(path), "--tenant", TENANT)
    return contacts


def _add_destination(system: System, peer, name: str, *profile: str) -> dict:
    port = peer.config.port
    key = peer.config.host_key.split(None, 1)[1]
    return system.cli("destination", "add", "--no-check",
                      "--tenant", TENANT, "--name", name, "--host", "127.0.0.1", "--port",
                      str(port), "--username", peer.config.username, "--remote-dir", peer.config.remote_dir,
                      "--credential-ref", peer.config.credential_ref, "--host-key", f"[127.0.0.1]:{port} {key}",
                      "--by", OPERATOR, *profile, "--json").json


def _deliver(system: System, admin, destination: str) -> dict:
    created = system.cli("create", "--tenant", TENANT, "--destination", destination, "--by", OPERATOR, "--json").json
    wait_status(system, admin, created["job_id"], "Completed")
    return {**created, "row": job_row(admin, created["job_id"])}


def _received(peer, delivered: dict) -> bytes:
    """The file the partner holds under the name the export was created with, checked against cutoff 2."""
    files = peer.files()
    data = files[delivered["final_name"]]
    row = delivered["row"]
    assert row["expected_file_name"] == delivered["final_name"]
    assert (len(data), hashlib.sha256(data).digest()) == (row["expected_file_bytes"],
                                                          bytes(row["expected_file_sha256"]))
    return data


def _neutralized(value: str) -> str:
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


@pytest.fixture
def partner_system(system: System, openssh_sftp, tmp_path):
    system.group.env.update(openssh_sftp.environ)
    system.cli("tenant", "add", TENANT)
    system.cli("operator", "grant", "--operator", OPERATOR, "--tenant", TENANT)
    contacts = _import(system, tmp_path)
    system.start_relay()
    system.start_worker()
    return system, openssh_sftp, contacts


@pytest.mark.openssh
def test_a_csv_profile_with_chosen_columns_semicolons_quotes_crlf_bom_gzip_and_formula_neutralising_arrives_field_for_field(  # noqa: E501
        partner_system, admin):
    system, peer, contacts = partner_system
    _add_destination(system, peer, "crm-feed", "--column", "email=E-Mail", "--column", "attributes.tier=Tier",
                     "--column", "full_name=Name", "--column", "attributes.Lead Source (2024)=Source",
                     "--column", "company", "--column", "phone", "--delimiter", ";", "--quoting", "all",
                     "--line-ending", "crlf", "--bom", "on", "--compression", "gzip",
                     "--neutralize-formulas", "on", "--file-name", "{tenant}_{sequence:05d}_{delivery_key}.csv.gz")

    delivered = _deliver(system, admin, "crm-feed")

    assert re.fullmatch(r"initech_00001_[0-9a-f]{32}\.csv\.gz", delivered["final_name"])
    text = gzip.decompress(_received(peer, delivered))
    assert text.startswith(b"\xef\xbb\xbf")
    # Every record ends CRLF; a line break inside a field stays as the contact has it.
    assert text.count(b"\r\n") >= len(contacts) + 1 and b'"Line one\nLine two"' in text
    rows = list(csv.reader(io.StringIO(text[3:].decode("utf-8"), newline=""), delimiter=";"))
    assert rows[0] == ["E-Mail", "Tier", "Name", "Source", "company", "phone"]
    expected = [[_neutralized(c[k]) for k in ("email", "tier", "full_name", "Lead Source (2024)", "company", "phone")]
                for c in contacts]
    assert rows[1:] == expected
    # Quoting all: every field, the empty ones excepted (COPY leaves NULL unquoted), is quoted.
    assert text.split(b"\r\n")[1].startswith(b'"quote@example.com";"gold";')


@pytest.mark.openssh
def test_a_tab_separated_file_without_header_and_json_lines_arrive_as_their_readers_parse_them(partner_system, admin):
    system, peer, contacts = partner_system
    _add_destination(system, peer, "tsv", "--delimiter", "tab", "--header", "off", "--file-name",
                     "tsv-{delivery_key}.txt", "--column", "email", "--column", "full_name",
                     "--column", "attributes.tier")
    _add_destination(system, peer, "jsonl", "--format", "jsonl", "--compression", "gzip", "--column", "email=Email",
                     "--column", "full_name=Name", "--column", "attributes.tier=tier", "--column", "company",
                     "--column", "attributes.Lead Source (2024)=source", "--file-name", "{delivery_key}.jsonl.gz")

    tsv = _deliver(system, admin, "tsv")
    jsonl = _deliver(system, admin, "jsonl")

    rows = list(csv.reader(io.StringIO(_received(peer, tsv).decode("utf-8"), newline=""), delimiter="\t"))
    assert rows == [[c["email"], c["full_name"], c["tier"]] for c in contacts]
    lines = gzip.decompress(_received(peer, jsonl)).decode("utf-8").split("\n")
    assert lines[-1] == ""   # every object ends its line
    objects = [json.loads(line) for line in lines[:-1]]
    # An empty custom field was never stored: JSON says null, where CSV says nothing.
    assert objects == [{"Email": c["email"], "Name": c["full_name"], "tier": c["tier"] or None,
                        "company": c["company"] or None, "source": c["Lead Source (2024)"] or None}
                       for c in contacts]
    assert list(objects[0]) == ["Email", "Name", "tier", "company", "source"]   # the profile's order


@pytest.mark.openssh
def test_an_edit_while_an_export_is_queued_builds_it_with_the_new_version_which_cutoff_2_records_and_show_prints(
        partner_system, admin):
    system, peer, contacts = partner_system
    _add_destination(system, peer, "partner", "--column", "email")
    before = system.cli("create", "--tenant", TENANT, "--destination", "partner", "--by", OPERATOR, "--json").json
    wait_status(system, admin, before["job_id"], "Completed")

    edited = system.cli("destination", "edit", "--tenant", TENANT, "--destination", "partner", "--column", "email",
                        "--column", "phone=Phone", "--by", OPERATOR, "--json").json
    after = _deliver(system, admin, "partner")

    assert edited["profile_version"] == 2 and edited["previous_version"] == 1
    stale = system.cli("destination", "edit", "--tenant", TENANT, "--destination", "partner", "--column", "email",
                       "--expected-version", "1", expect=4)
    assert "is v2, not v1; nothing written" in stale.stderr
    assert job_row(admin, before["job_id"])["expected_profile_version"] == 1
    assert after["row"]["expected_profile_version"] == 2
    first = list(csv.reader(io.StringIO(_received(peer, {**before, "row": job_row(admin, before["job_id"])}).decode(),
                                        newline="")))
    second = list(csv.reader(io.StringIO(_received(peer, after).decode(), newline="")))
    assert first[0] == ["email"] and second[0] == ["email", "Phone"]
    assert second[1:] == [[c["email"], c["phone"]] for c in contacts]
    shown = system.cli("show", after["job_id"], "--tenant", TENANT)
    assert "built with profile v2" in shown.stdout
    # Both versions stay on record.
    assert system.cli("destination", "show", "--tenant", TENANT, "--destination", "partner", "--version", "1",
                      "--json").json["profile"]["columns"] == [{"source": "email", "header": "email"}]


@pytest.mark.openssh
def test_preview_prints_the_first_rows_exactly_as_the_partner_receives_them_before_compression(
        partner_system, admin, tmp_path):
    system, peer, _contacts = partner_system
    _add_destination(system, peer, "partner", "--delimiter", ";", "--line-ending", "crlf", "--compression", "gzip",
                     "--neutralize-formulas", "on", "--column", "email", "--column", "full_name=Name",
                     "--column", "attributes.tier")
    jobs_before = admin.execute("SELECT count(*) AS n FROM export_jobs").fetchone()["n"]

    preview = system.cli("preview", "--tenant", TENANT, "--destination", "partner", "--rows", "7",
                         "--output", str(tmp_path / "preview.csv"))
    delivered = _deliver(system, admin, "partner")

    assert preview.stdout == ""
    previewed = (tmp_path / "preview.csv").read_bytes()
    whole = gzip.decompress(_received(peer, delivered))
    assert whole.startswith(previewed) and previewed.count(b"\r\n") >= 8
    assert len(list(csv.reader(io.StringIO(previewed.decode(), newline=""), delimiter=";"))) == 8   # header + 7
    assert admin.execute("SELECT count(*) AS n FROM export_jobs").fetchone()["n"] == jobs_before + 1


# --- OpenPGP -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parties(tmp_path_factory):
    if shutil.which("gpg") is None:
        unavailable("gpg (GnuPG 2.2) is not installed: .ci/install-sftp-servers installs it")
    root = tmp_path_factory.mktemp("parties")
    alice, bob, ours = make_party(root, "alice"), make_party(root, "bob"), make_party(root, "ours", usage="sign")
    for partner in (alice, bob):
        gpg(partner.home, "--import", data=ours.public.encode())
    keys = {}
    for party in (alice, bob):
        keys[party.home.name] = root / f"{party.home.name}.asc"
        keys[party.home.name].write_text(party.public)
    expiring = make_party(root, "expiring", expire="2020-06-01", when="20200101T000000!")
    (root / "expired.asc").write_text(expiring.public)
    yield {"alice": alice, "bob": bob, "ours": ours, "ours_secret": ours.export_secret(root / "ours.gpg"),
           "keys": keys, "expired": root / "expired.asc", "root": root}
    stop_agents(root)


@pytest.mark.openssh
def test_gzip_then_openpgp_to_two_partners_signed_by_us_decrypts_with_each_partners_key_to_the_contacts(
        partner_system, admin, parties, tmp_path):
    system, peer, contacts = partner_system
    added = _add_destination(system, peer, "secure", "--compression", "gzip", "--encrypt-to",
                             str(parties["keys"]["alice"]), "--encrypt-to", str(parties["keys"]["bob"]),
                             "--sign-with", f"keyfile:{parties['ours_secret']}", "--column", "email",
                             "--column", "attributes.tier=Tier", "--file-name", "{delivery_key}.csv.gz.gpg")

    delivered = _deliver(system, admin, "secure")

    assert [k["fingerprint"] for k in added["profile"]["encrypt_to"]] == [parties["alice"].fingerprint,
                                                                         parties["bob"].fingerprint]
    encrypted = tmp_path / "received.gpg"
    encrypted.write_bytes(_received(peer, delivered))
    expected = [["email", "Tier"]] + [[c["email"], c["tier"]] for c in contacts]
    for partner in (parties["alice"], parties["bob"]):
        plain = tmp_path / f"{partner.home.name}.csv.gz"
        done = gpg(partner.home, "--yes", "--output", str(plain), "--decrypt", str(encrypted))
        status = done.stderr.decode()
        assert f"VALIDSIG {parties['ours'].fingerprint}" in status or \
            re.search(rf"VALIDSIG \w+ .*{parties['ours'].fingerprint}", status)
        rows = list(csv.reader(io.StringIO(gzip.decompress(plain.read_bytes()).decode(), newline="")))
        assert rows == expected
    # The signing key is a reference: the stored profile names it "keyfile:<path>", and the only key material
    # it holds is the partners' public keys (imported into a home of their own, they give no secret key).
    [stored] = [r["profile"] for r in admin.execute(
        "SELECT p.profile FROM delivery_profiles p JOIN destinations d ON d.id = p.destination_id"
        " WHERE d.name = 'secure'")]
    assert stored["sign_with"] == f"keyfile:{parties['ours_secret']}"
    assert set(stored) == set(added["profile"])
    # A short home of its own: gpg-agent's socket lives in it, and a test's temporary path can be longer
    # than a socket path may be.
    home = Path(tempfile.mkdtemp(prefix="gpg-stored-"))
    try:
        gpg(home, "--import", data="".join(k["armored"] for k in stored["encrypt_to"]).encode())
        listed = gpg(home, "--with-colons", "--list-keys").stdout.decode()
        secret = gpg(home, "--with-colons", "--list-secret-keys").stdout
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)
    assert {line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:")} >= {
        parties["alice"].fingerprint, parties["bob"].fingerprint}
    assert parties["ours"].fingerprint not in listed
    assert secret == b""


@pytest.mark.openssh
def test_a_partner_key_that_expired_after_it_was_set_fails_the_export_before_cutoff_2_for_an_operator_to_act(
        partner_system, admin, parties):
    system, peer, _contacts = partner_system
    _add_destination(system, peer, "secure", "--encrypt-to", str(parties["keys"]["alice"]))
    # The key expires after it was set: as a later release would find it, written over the stored profile.
    profile = admin.execute("SELECT p.profile FROM delivery_profiles p JOIN destinations d ON d.id = p.destination_id"
                            " WHERE d.name = 'secure'").fetchone()["profile"]
    profile["encrypt_to"][0]["expires_at"] = "2020-06-01T00:00:00+00:00"
    edited = system.cli("destination", "edit", "--tenant", TENANT, "--destination", "secure", "--column", "email",
                        "--json").json
    admin.execute("ALTER TABLE delivery_profiles DISABLE TRIGGER tr_delivery_profiles_append_only")
    admin.execute("UPDATE delivery_profiles SET profile = %s WHERE version = %s AND destination_id ="
                  " (SELECT id FROM destinations WHERE name = 'secure')", (Jsonb(profile), edited["profile_version"]))
    admin.execute("ALTER TABLE delivery_profiles ENABLE TRIGGER tr_delivery_profiles_append_only")

    created = system.cli("create", "--tenant", TENANT, "--destination", "secure", "--by", OPERATOR, "--json").json
    wait_status(system, admin, created["job_id"], "Failed")

    row = job_row(admin, created["job_id"])
    assert row["failure_reason"] == "BuildFailed" and row["delivery_authorized_at"] is None
    failed = admin.execute("SELECT detail FROM export_attempt_events WHERE job_id = %s AND kind = 'Failed'",
                           (created["job_id"],)).fetchone()["detail"]
    assert failed.startswith("BuildFailed (configuration)") and parties["alice"].fingerprint in failed
    assert peer.files() == {}


@pytest.mark.parametrize(("option", "says"), [
    ("malformed", "not a well-formed OpenPGP public key"),
    ("expired", "expired"),
    ("missing", "No such file"),
])
def test_a_malformed_expired_or_missing_partner_key_is_refused_at_destination_add_and_nothing_is_written(
        exports_cli, admin, parties, tmp_path, option, says):
    exports_cli("tenant", "add", TENANT)
    paths = {"malformed": tmp_path / "bad.asc", "expired": parties["expired"], "missing": tmp_path / "none.asc"}
    paths["malformed"].write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nnot a key\n"
                                  "-----END PGP PUBLIC KEY BLOCK-----\n")
    host_key = paramiko.RSAKey.generate(1024)

    result = exports_cli("destination", "add", "--no-check", "--tenant", TENANT, "--name", "p", "--host", "127.0.0.1",
                         "--username", "u", "--remote-dir", "/in", "--credential-ref", "env:X",
                         "--host-key", f"127.0.0.1 ssh-rsa {host_key.get_base64()}",
                         "--encrypt-to", str(paths[option]), expect=2)

    assert says.lower() in result.stderr.lower() and result.stderr.count("\n") == 1
    assert admin.execute("SELECT count(*) AS n FROM destinations").fetchone()["n"] == 0


# --- completion markers -----------------------------------------------------------------------------------


@pytest.mark.openssh
def test_a_manifest_follows_the_file_and_names_its_bytes_sha256_rows_export_and_key_as_cutoff_2_recorded(
        partner_system, admin):
    system, peer, contacts = partner_system
    _add_destination(system, peer, "ingest", "--marker", "manifest", "--compression", "gzip",
                     "--file-name", "feed-{sequence}-{delivery_key}.csv.gz")

    delivered = _deliver(system, admin, "ingest")

    data = _received(peer, delivered)
    manifest_bytes = peer.files()[delivered["final_name"] + ".manifest.json"]
    manifest = json.loads(manifest_bytes)
    assert manifest == {"name": delivered["final_name"], "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "rows": len(contacts), "export_id": delivered["job_id"],
                        "delivery_key": delivered["delivery_key"]}
    assert manifest["rows"] == len(list(csv.reader(io.StringIO(gzip.decompress(data).decode(), newline="")))) - 1
    row = delivered["row"]
    assert (row["expected_marker_name"], bytes(row["expected_marker"])) == (delivered["final_name"] + ".manifest.json",
                                                                            manifest_bytes)
    assert sorted(peer.files()) == sorted([delivered["final_name"], delivered["final_name"] + ".manifest.json"])


@pytest.mark.openssh
def test_a_done_marker_is_an_empty_file_beside_the_delivered_one(partner_system, admin):
    system, peer, _contacts = partner_system
    _add_destination(system, peer, "ingest", "--marker", "done")

    delivered = _deliver(system, admin, "ingest")

    _received(peer, delivered)
    assert peer.files()[delivered["final_name"] + ".done"] == b""


@pytest.mark.openssh
def test_a_marker_that_cannot_be_written_leaves_the_export_outcome_unknown_with_the_file_delivered_once(
        partner_system, admin):
    system, peer, _contacts = partner_system
    _add_destination(system, peer, "ingest", "--marker", "done", "--file-name", "feed-{sequence}.csv")
    # The marker's name is taken (by a directory the partner left): the no-overwrite rename refuses it.
    (peer.inbox / "feed-1.csv.done").mkdir()

    created = system.cli("create", "--tenant", TENANT, "--destination", "ingest", "--by", OPERATOR, "--json").json
    wait_status(system, admin, created["job_id"], "OutcomeUnknown")

    assert created["final_name"] == "feed-1.csv"
    row = job_row(admin, created["job_id"])
    assert hashlib.sha256((peer.inbox / "feed-1.csv").read_bytes()).digest() == bytes(row["expected_file_sha256"])
    finished = admin.execute("SELECT detail FROM export_attempt_events WHERE job_id = %s AND kind = 'Finished'",
                             (created["job_id"],)).fetchone()["detail"]
    assert "completion marker feed-1.csv.done was not confirmed" in finished
    assert not any(name.startswith(".") for name in peer.files())   # no temporary marker left behind


@pytest.mark.parametrize(("options", "says"), [
    (("--column", "password"), "unknown column 'password'"),
    (("--column", "attributes.x'); DROP TABLE contacts;--"), "no quotes, semicolons"),
    (("--file-name", "../{delivery_key}.csv"), "no path separators"),
    (("--file-name", "daily.csv"), "needs {delivery_key} or {sequence}"),
    (("--file-name", "{delivery_key}-{when}.csv"), "unknown placeholder"),
    (("--delimiter", '"'), "delimiter"),
    (("--format", "xml"), "one of csv, jsonl"),
    (("--time-zone", "Mars/Base"), "unknown time zone"),
    (("--sign-with", "keyfile:/nowhere/key.gpg"), "signing"),
])
def test_a_bad_profile_option_at_add_or_edit_is_one_line_and_exit_2_and_writes_nothing(exports_cli, admin, options,
                                                                                        says):
    exports_cli("tenant", "add", TENANT)
    host_key = paramiko.RSAKey.generate(1024)
    destination = ("destination", "add", "--no-check",
                   "--tenant", TENANT, "--name", "p", "--host", "127.0.0.1", "--username", "u",
                   "--remote-dir", "/in", "--credential-ref", "env:X",
                   "--host-key", f"127.0.0.1 ssh-rsa {host_key.get_base64()}")

    added = exports_cli(*destination, *options, expect=2)
    exports_cli(*destination)
    edited = exports_cli("destination", "edit", "--tenant", TENANT, "--destination", "p", *options, expect=2)

    for result in (added, edited):
        assert says in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert admin.execute("SELECT count(*) AS n FROM destinations").fetchone()["n"] == 1
    assert admin.execute("SELECT max(version) AS v FROM delivery_profiles").fetchone()["v"] == 1


@pytest.mark.openssh
def test_an_edit_committed_while_a_build_runs_does_not_reach_that_build_which_cutoff_2_records_as_the_old_version(
        partner_system, admin, db_url):
    system, peer, contacts = partner_system
    _add_destination(system, peer, "partner", "--column", "email")
    holder = hold_builds(db_url)
    try:
        created = system.cli("create", "--tenant", TENANT, "--destination", "partner", "--by", OPERATOR,
                             "--json").json
        wait_until(lambda: builder_blocked_by(admin, holder), "the build to wait on the contacts lock", DEADLINE)
        # The attempt read version 1 with its job; version 2 commits while its COPY waits.
        system.cli("destination", "edit", "--tenant", TENANT, "--destination", "partner", "--column", "email",
                   "--column", "phone", "--by", OPERATOR)
    finally:
        holder.rollback()
        holder.close()
    wait_status(system, admin, created["job_id"], "Completed")

    delivered = {**created, "row": job_row(admin, created["job_id"])}
    rows = list(csv.reader(io.StringIO(_received(peer, delivered).decode(), newline="")))
    assert rows == [["email"]] + [[c["email"]] for c in contacts]   # all of version 1, nothing of version 2
    assert delivered["row"]["expected_profile_version"] == 1
