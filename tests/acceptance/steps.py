"""What an operator does in the acceptance scenes, through the real ``exports`` command, and what a scene
waits for and checks: a tenant with contacts and a destination on the partner, an export created or
canceled, a status reached within a deadline that a loaded machine meets, builds held behind a lock
(seen waiting by the database's own account), a file delivered exactly once."""

from __future__ import annotations

import hashlib

import psycopg

from app.store.export import final_name
from exports_devtools.waiting import wait_until
from tests.fixtures.processes import System

TENANT = "Initech"
OPERATOR = "alice"
#: Seconds a step may take, process start-up and one lease expiry included.
DEADLINE = 90.0


def status(admin, job_id: str) -> str:
    return admin.execute("SELECT status FROM export_jobs WHERE id = %s", (job_id,)).fetchone()["status"]


def job_row(admin, job_id: str) -> dict:
    return admin.execute("SELECT * FROM export_jobs WHERE id = %s", (job_id,)).fetchone()


def transitions(admin, job_id: str) -> list[str]:
    return [r["kind"] for r in admin.execute(
        "SELECT kind FROM export_attempt_events WHERE job_id = %s AND kind <> 'DeliveryEvidence' ORDER BY id",
        (job_id,))]


def assert_delivered_once(admin, peer, job_id: str) -> None:
    job = job_row(admin, job_id)
    files = peer.files()
    assert list(files) == [final_name(job["delivery_key"])]
    assert hashlib.sha256(files[final_name(job["delivery_key"])]).digest() == bytes(job["expected_file_sha256"])
    assert transitions(admin, job_id).count("Finished") == 1


def hold_builds(db_url: str) -> psycopg.Connection:
    """A build's first read of contacts waits behind this lock until it is released."""
    holder = psycopg.connect(db_url, autocommit=False)
    holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
    return holder


def builder_blocked_by(admin, holder: psycopg.Connection) -> bool:
    """The build's query waits on the holder's lock, by the database's own account."""
    return admin.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'exports-builder' AND %s = ANY(pg_blocking_pids(pid))",
        (holder.info.backend_pid,)).fetchone()["n"] == 1


def wait_status(system: System, admin, job_id: str, wanted: str) -> None:
    wait_until(lambda: status(admin, job_id) == wanted, f"export {job_id} to be {wanted}", DEADLINE,
               diagnostics=lambda: f"status {status(admin, job_id)}\n{system.group.logs()}")


def set_up(system: System, peer, *, contacts: int = 500, via_port: int | None = None) -> None:
    """A tenant, its operator, contacts, and a destination on the partner (through ``via_port`` when given)."""
    system.cli("tenant", "add", TENANT)
    system.cli("operator", "grant", "--operator", OPERATOR, "--tenant", TENANT)
    system.cli("contacts", "generate", "--tenant", TENANT, "--count", str(contacts), "--seed", "1")
    port = via_port or peer.config.port
    key = peer.config.host_key.split(None, 1)[1]
    system.cli("destination", "add", "--no-check",
               "--tenant", TENANT, "--name", "partner", "--host", "127.0.0.1", "--port",
               str(port), "--username", peer.config.username, "--remote-dir", peer.config.remote_dir,
               "--credential-ref", peer.config.credential_ref, "--host-key", f"[127.0.0.1]:{port} {key}")


def create(system: System) -> str:
    created = system.cli("create", "--tenant", TENANT, "--destination", "partner", "--by", OPERATOR, "--json")
    return created.json["job_id"]


def cancel(system: System, job_id: str) -> dict:
    return system.cli("cancel", job_id, "--tenant", TENANT, "--by", OPERATOR, "--json").json
