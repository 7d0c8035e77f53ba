"""The builder: the tenant's consenting contacts, streamed by PostgreSQL into a file named for the
attempt, with the size and hash cutoff 2 records; stopped promptly even while the database makes it
wait; every other failure wrapped."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from app import metrics
from app.actors.builder import CHUNK_BYTES, BuildFailed, BuildStopped, ContactsBuilder, file_name
from app.actors.policy import Scope
from app.actors.stop import StopReason, StopSignal
from app.delivery.openpgp import parse_public_key
from app.delivery.profile import Compression, Profile
from exports_devtools.waiting import wait_until
from tests.fixtures.openpgp import Party, gpg, make_party, stop_agents
from tests.fixtures.worker import insert_contacts
from tests.support import Background, unavailable


@pytest.fixture
def tenants(seed, conn):
    tenant, other = seed.tenant(), seed.tenant("Other")
    insert_contacts(conn, tenant, 30, consent=True)
    insert_contacts(conn, tenant, 7, consent=False, prefix="no-consent-")
    insert_contacts(conn, other, 9, consent=True, prefix="other-tenant-")
    return tenant, other


def test_a_build_writes_only_the_tenants_consenting_contacts_with_the_size_and_hash_of_the_file(
        db_url, tenants, tmp_path):
    tenant, _ = tenants
    job_id, attempt_id = uuid.uuid4(), uuid.uuid4()

    built = ContactsBuilder(db_url, tmp_path).build(job_id=job_id, attempt_id=attempt_id, tenant_id=tenant,
                                                    scope=Scope.CONSENTING_CONTACTS, stop=StopSignal())

    assert built.path == tmp_path / file_name(job_id, attempt_id) == tmp_path / f"{job_id}.{attempt_id}.csv"
    data = built.path.read_bytes()
    assert (built.size, built.sha256) == (len(data), hashlib.sha256(data).digest())
    rows = list(csv.DictReader(io.StringIO(data.decode())))
    assert [r["email"] for r in rows] == [f"c{i}@example.com" for i in range(30)]
    assert rows[0] == {"email": "c0@example.com", "full_name": "Name c0", "company": "Acme, Inc.",
                       "phone": "+1-555-0000"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [built.path.name]   # no partial file left


def test_a_build_of_many_chunks_writes_exactly_the_bytes_copy_sends_row_by_row_for_awkward_contacts(
        db_url, conn, seed, tmp_path):
    tenant = seed.tenant()
    awkward = [('Say "hi"', "Acme, Inc.", None), ("Line one\nLine two", "", "CR\r\nLF"),
               ("Zoë Ångström 山田太郎", "Société générale ✓", "☎ 555"), ("back\\slash", "\\.", " spaced ")]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO contacts (tenant_id, email, full_name, company, phone, consent)"
                        " VALUES (%s, %s, %s, %s, %s, true)",
                        [(tenant, f"{i}@example.com", *awkward[i % len(awkward)]) for i in range(20_000)])

    built = ContactsBuilder(db_url, tmp_path).build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant,
                                                    scope=Scope.CONSENTING_CONTACTS, stop=StopSignal())

    data = built.path.read_bytes()
    assert len(data) > 3 * CHUNK_BYTES
    assert data == _row_by_row(conn, tenant)
    assert (built.size, built.sha256) == (len(data), hashlib.sha256(data).digest())


def test_a_backend_terminated_while_rows_stream_is_built_again_from_the_start_on_a_fresh_connection(
        db_url, conn, admin, seed, tmp_path):
    tenant = seed.tenant()
    # About 48 MB in long rows: more than the socket buffers hold, so the COPY is still sending.
    admin.execute("INSERT INTO contacts (tenant_id, email, full_name, company, phone, consent)"
                  " SELECT %s, 'bulk' || i || '@example.com', repeat(md5(i::text), 256), 'Company', NULL, true"
                  " FROM generate_series(1, 6000) i", (tenant,))
    terminated = []

    def terminate_once(stop):
        if terminated:
            return
        backend = admin.execute("SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
                                " AND application_name = 'exports-builder'").fetchone()
        assert backend["state"] == "active"
        assert admin.execute("SELECT pg_terminate_backend(%s) AS t", (backend["pid"],)).fetchone()["t"]
        terminated.append(backend["pid"])

    retries_before = metrics.worker().build_retries._value.get()
    built = ContactsBuilder(db_url, tmp_path, checkpoint=terminate_once).build(
        job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant, scope=Scope.CONSENTING_CONTACTS,
        stop=StopSignal())

    assert len(terminated) == 1 and metrics.worker().build_retries._value.get() - retries_before == 1
    data = built.path.read_bytes()
    assert data == _row_by_row(conn, tenant) and (built.size, built.rows) == (len(data), 6000)
    assert sorted(p.name for p in tmp_path.iterdir()) == [built.path.name]


def test_a_stop_while_the_query_waits_on_the_database_cancels_it_and_removes_the_partial_file(
        db_url, admin, tenants, tmp_path):
    tenant, _ = tenants
    stop = StopSignal()
    with psycopg.connect(db_url, row_factory=dict_row) as locker:
        locker.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
        builder = ContactsBuilder(db_url, tmp_path)
        build = Background(lambda: builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant,
                                                 scope=Scope.CONSENTING_CONTACTS, stop=stop))
        # The COPY waits for the table lock; the stop must not wait with it.
        waiting = _builder_backend(admin)
        stop.set(StopReason.STOP_REQUESTED)
        with pytest.raises(BuildStopped) as stopped:
            build.result()
        assert admin.execute("SELECT pg_blocking_pids(%s) AS p", (waiting,)).fetchone()["p"] == []
        locker.rollback()

    assert stopped.value.reason is StopReason.STOP_REQUESTED
    assert list(tmp_path.iterdir()) == []


def test_a_failure_other_than_a_stop_is_wrapped_and_leaves_no_file(db_url, tenants, tmp_path):
    tenant, _ = tenants

    def lost_disk(stop):
        raise OSError(28, "No space left on device")

    with pytest.raises(BuildFailed) as failed:
        ContactsBuilder(db_url, tmp_path, checkpoint=lost_disk).build(
            job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant, scope=Scope.CONSENTING_CONTACTS,
            stop=StopSignal())

    assert isinstance(failed.value.__cause__, OSError) and "No space left" in str(failed.value)
    assert list(tmp_path.iterdir()) == []


def test_a_build_whose_stop_is_already_set_does_not_query_at_all(db_url, tenants, tmp_path):
    tenant, _ = tenants
    stop = StopSignal()
    stop.set(StopReason.LEASE_LOST)
    connects = []

    class Recorded:
        def connection(self):
            connects.append(1)
            raise AssertionError("the build asked for a connection")

    builder = ContactsBuilder(db_url, tmp_path, db=Recorded())

    with pytest.raises(BuildStopped) as stopped:
        builder.build(job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant,
                      scope=Scope.CONSENTING_CONTACTS, stop=stop)

    assert stopped.value.reason is StopReason.LEASE_LOST and connects == []


def _row_by_row(conn, tenant_id) -> bytes:
    """The file before delivery profiles, read as psycopg hands COPY out, one row per read: PostgreSQL's
    own CSV with its header. The default profile must deliver exactly these bytes."""
    with conn.cursor() as cur, cur.copy(
            "COPY (SELECT email, full_name, company, phone FROM contacts WHERE tenant_id = %s AND consent"
            " ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER true, ENCODING 'UTF8')", (tenant_id,)) as copied:
        return b"".join(bytes(row) for row in copied)


def _builder_backend(admin) -> int:
    """The builder's backend once the server shows it blocked."""
    row = wait_until(lambda: admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'exports-builder' AND cardinality(pg_blocking_pids(pid)) > 0").fetchone(),
        "the builder's COPY to wait on the table lock", interval=0.01)
    return row["pid"]


def _gpg_children() -> list[int]:
    """This process's gpg children (the encryptor's), reaped ones not counted."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if name == "gpg" and int(rest[1]) == os.getpid() and rest[0] != "Z":
                found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def partner(tmp_path_factory) -> Iterator[Party]:
    """A partner keypair made by the real gpg; encrypted builds are to its public key."""
    if shutil.which("gpg") is None:
        unavailable("gpg (GnuPG 2.2) is not installed: .ci/install-sftp-servers installs it")
    root = tmp_path_factory.mktemp("keys")
    yield make_party(root, "partner")
    stop_agents(root)


def _encrypted(partner: Party) -> Profile:
    return Profile.checked(compression=Compression.GZIP, encrypt_to=(parse_public_key(partner.public),))


def test_a_stop_while_an_encrypted_build_streams_kills_gpg_and_leaves_no_file(db_url, conn, seed, tmp_path, partner):
    tenant = seed.tenant()
    insert_contacts(conn, tenant, 20_000, consent=True, prefix="enc-")
    profile = _encrypted(partner)
    work = tmp_path / "work"
    seen: list[list[int]] = []

    def stop_once_gpg_runs(stop):
        if not seen:
            seen.append(_gpg_children())
            stop.set(StopReason.STOP_REQUESTED)

    with pytest.raises(BuildStopped) as stopped:
        ContactsBuilder(db_url, work, checkpoint=stop_once_gpg_runs).build(
            job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant, scope=Scope.CONSENTING_CONTACTS,
            stop=StopSignal(), profile=profile)

    assert stopped.value.reason is StopReason.STOP_REQUESTED
    assert len(seen[0]) == 1   # gpg was running when the stop came, after the first chunk
    assert _gpg_children() == [] and list(work.iterdir()) == []


def test_an_encrypted_build_is_the_gzip_of_the_csv_under_openpgp_and_cutoff_2_gets_the_ciphertexts_hash(
        db_url, conn, seed, tmp_path, partner):
    tenant = seed.tenant()
    insert_contacts(conn, tenant, 2_000, consent=True, prefix="enc-")
    profile = _encrypted(partner)

    built = ContactsBuilder(db_url, tmp_path / "work").build(
        job_id=uuid.uuid4(), attempt_id=uuid.uuid4(), tenant_id=tenant, scope=Scope.CONSENTING_CONTACTS,
        stop=StopSignal(), profile=profile)

    data = built.path.read_bytes()
    assert (built.size, built.sha256, built.rows) == (len(data), hashlib.sha256(data).digest(), 2_000)
    plain = gpg(partner.home, "--decrypt", data=data).stdout
    assert gzip.decompress(plain) == _row_by_row(conn, tenant)
