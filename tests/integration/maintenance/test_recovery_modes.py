"""Recovery judges an expired delivery by the rules of the delivery mode its cutoff 2 recorded, whatever the
destination's mode says now: in no-stat it never looks at the destination (the server allows no look),
and the export waits for the partner's word; in the others it looks, as the destination row describes it."""

from __future__ import annotations

from app.maintenance.recovery import Recovery, RecoveryConfig, RecoveryCounts
from app.store.types import Status
from tests.integration.maintenance.test_scheduler_services import (
    destination_row,
    expired_delivering,
    settings_for,
)


def _recorded(admin, job, mode: str) -> None:
    admin.execute("UPDATE export_jobs SET expected_delivery_mode = %s WHERE id = %s", (mode, job.id))


def test_an_expired_no_stat_delivery_is_never_looked_at_and_waits_for_the_partners_word(
        app_db, admin, conn, seed, embedded_sftp, monkeypatch, tmp_path):
    for name, value in embedded_sftp.environ.items():
        monkeypatch.setenv(name, value)
    tenant = seed.tenant()
    job = expired_delivering(seed, seed.running(seed.queued(tenant, destination_row(conn, tenant, embedded_sftp))))
    expected = seed.expected(job)
    (embedded_sftp.inbox / expected.name).write_bytes(b"x" * expected.size)   # a look would prove it
    _recorded(admin, job, "no-stat")

    counts = Recovery(app_db, RecoveryConfig.from_settings(settings_for(tmp_path))).run_once()

    assert counts == RecoveryCounts(scanned=1, outcome_unknown=1)
    assert seed.status(job) is Status.OUTCOME_UNKNOWN
    resolved = [e["detail"] for e in seed.events(job) if e["kind"] == "ResolvedByRecovery"]
    assert len(resolved) == 1 and "mode no-stat" in resolved[0] and "partner's word" in resolved[0]
    assert not any('"inspected"' in (e["detail"] or "") for e in seed.events(job))


def test_an_expired_quick_ingest_delivery_is_looked_at_and_completed_from_what_it_shows(
        app_db, admin, conn, seed, embedded_sftp, monkeypatch, tmp_path):
    for name, value in embedded_sftp.environ.items():
        monkeypatch.setenv(name, value)
    tenant = seed.tenant()
    job = expired_delivering(seed, seed.running(seed.queued(tenant, destination_row(conn, tenant, embedded_sftp))))
    expected = seed.expected(job)
    (embedded_sftp.inbox / expected.name).write_bytes(b"x" * expected.size)
    _recorded(admin, job, "quick-ingest")

    counts = Recovery(app_db, RecoveryConfig.from_settings(settings_for(tmp_path))).run_once()

    assert counts == RecoveryCounts(scanned=1, completed=1)
