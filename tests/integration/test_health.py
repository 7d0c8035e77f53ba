"""``exports health``'s checks: each fails on the symptom an operator must act on, and says why."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from app import health
from app.config import ConfigError, Settings
from app.heartbeat import identity
from app.store import export, heartbeat, webhooks
from app.store.types import FailureCode
from tests.fixtures.sftp import free_port


def _settings(**changes) -> Settings:
    return dataclasses.replace(Settings(), **changes)


def _by_name(checks) -> dict[str, health.Check]:
    return {c.name: c for c in checks}


def test_a_quiet_deployment_is_healthy(db_url):
    checks = _by_name(health.run(_settings(), db_url))

    assert all(c.ok for c in checks.values()), checks
    assert set(checks) == {"database", "broker", "schema", "relay", "recovery", "queue", "webhooks"}


def test_an_outbox_row_older_than_the_limit_means_the_relay_is_behind(db_url, seed, admin):
    job = seed.queued()
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("UPDATE outbox SET created_at = created_at - interval '10 minutes' WHERE job_id = %s", (job.id,))

    relay = _by_name(health.run(_settings(), db_url))["relay"]

    assert not relay.ok and "1 unpublished outbox rows" in relay.detail


def test_a_lease_expired_long_ago_means_recovery_is_not_running(db_url, seed):
    seed.expire_lease(seed.running(), seconds_ago=3600)

    recovery = _by_name(health.run(_settings(recovery_interval_seconds=10), db_url))["recovery"]

    assert not recovery.ok and "1 expired leases" in recovery.detail


def _owed_event(seed, conn, admin, *, minutes_ago: float, tenant_name: str = "Acme") -> None:
    """An endpoint of a new tenant, owed the outcome of one of its exports since ``minutes_ago``."""
    tenant = seed.tenant(tenant_name)
    webhooks.add_endpoint(conn, endpoint_id=uuid.uuid4(), endpoint=webhooks.NewEndpoint(
        tenant_id=tenant, name="prod", url="https://hooks.example/in", secret_ref="env:HOOK", created_by="t"))
    job = seed.running(seed.queued(tenant))
    export.try_finish_failed(conn, job_id=job.id, attempt_id=job.attempt_id, worker_id="w",
                             failure_reason=FailureCode.BUILD_FAILED)
    with admin.transaction():   # the past, which only the owner may write, past the event-only trigger
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute("UPDATE webhook_deliveries SET occurred_at = clock_timestamp() - make_interval(mins => %s) "
                      "WHERE job_id = %s", (minutes_ago, job.id))


def test_an_event_owed_to_a_receiver_past_the_limit_fails_the_webhooks_check_naming_the_endpoint(db_url, seed, conn,
                                                                                              admin):
    _owed_event(seed, conn, admin, minutes_ago=1, tenant_name="Globex")
    recent = _by_name(health.run(_settings(webhook_late_seconds=900), db_url))["webhooks"]
    _owed_event(seed, conn, admin, minutes_ago=20)

    late = _by_name(health.run(_settings(webhook_late_seconds=900), db_url))["webhooks"]

    assert recent.ok and "1 events owed" in recent.detail
    assert not late.ok and "2 events owed" in late.detail and "late: Acme/prod (1200 s)" in late.detail
    assert "Globex" not in late.detail


def test_a_delivery_given_up_in_the_last_day_fails_the_webhooks_check(db_url, seed, conn, admin):
    _owed_event(seed, conn, admin, minutes_ago=0)
    admin.execute("UPDATE webhook_deliveries SET state = 'dead', finished_at = clock_timestamp()")

    check = _by_name(health.run(_settings(), db_url))["webhooks"]

    assert not check.ok and "1 given up in the last day" in check.detail


def test_a_required_role_without_a_live_process_fails_and_one_with_a_heartbeat_passes(db_url, conn):
    heartbeat.beat(conn, identity("relay"))

    checks = _by_name(health.run(_settings(), db_url, require=["relay", "worker"]))

    assert checks["relay processes"].ok and not checks["worker processes"].ok


def test_an_unreachable_database_is_one_failed_check_that_keeps_its_cause_but_not_the_password():
    checks = _by_name(health.run(_settings(), "postgresql://nobody:s3cret@127.0.0.1:1/none"))

    database = checks["database"]
    assert not database.ok and database.detail.startswith("cannot connect: OperationalError: ")
    assert 'port 1 failed' in database.detail and "s3cret" not in database.detail
    assert "\n" not in database.detail


def test_a_cause_that_repeats_the_password_has_it_cut_out():
    cause = health.cause(RuntimeError('password "s3cret" rejected\nsecond line'), "postgresql://u:s3cret@h/db")

    assert cause == 'RuntimeError: password "***" rejected'


def test_a_process_serving_its_metrics_is_alive_and_one_not_serving_is_not(tmp_path):
    from app import metrics

    metrics.announce_build()
    port = metrics.serve("127.0.0.1:0")
    closed = free_port()

    alive = health.probe_process(_settings(relay_metrics=f"127.0.0.1:{port}"), "relay")
    gone = health.probe_process(_settings(scheduler_metrics=f"127.0.0.1:{closed}"), "scheduler")

    assert alive == health.Check("relay process", True, f"http://127.0.0.1:{port}/metrics answers")
    assert not gone.ok and gone.name == "scheduler process"
    assert gone.detail.startswith(f"http://127.0.0.1:{closed}/metrics does not answer: URLError")


def test_a_process_whose_metrics_are_off_cannot_be_probed_and_says_which_setting():
    with pytest.raises(ConfigError, match="EXPORTS_WORKER_METRICS is off"):
        health.probe_process(_settings(worker_metrics="off"), "worker")


def test_an_unreachable_broker_names_the_error_class_and_not_the_url():
    url = "redis://:s3cret@127.0.0.1:1/0"
    [broker] = [c for c in health.run(_settings(broker_url=url), "postgresql://nobody@127.0.0.1:1/none")
                if c.name == "broker"]

    assert not broker.ok and "s3cret" not in broker.detail
