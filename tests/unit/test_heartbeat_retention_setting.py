"""The heartbeat retention: read from EXPORTS_HEARTBEAT_RETENTION_SECONDS with a week by default, refused
in one line naming the variable when unusable, and handed to the pruner with the silent limit that
``exports processes`` and ``exports health`` use."""

from __future__ import annotations

import pytest

from app.config import ConfigError, Settings
from app.heartbeat import SILENT_INTERVALS
from app.maintenance.heartbeats import PruneConfig


def test_the_retention_is_a_week_unless_the_environment_says_otherwise():
    assert Settings.from_env({}).heartbeat_retention_seconds == 7 * 86400.0
    assert Settings.from_env({"EXPORTS_HEARTBEAT_RETENTION_SECONDS": "3600"}).heartbeat_retention_seconds == 3600.0


@pytest.mark.parametrize("value", ["a week", "0", "-5"])
def test_an_unusable_retention_is_refused_naming_the_variable(value):
    with pytest.raises(ConfigError, match="EXPORTS_HEARTBEAT_RETENTION_SECONDS"):
        Settings.from_env({"EXPORTS_HEARTBEAT_RETENTION_SECONDS": value})


def test_the_pruner_counts_a_process_dead_after_the_silent_limit_the_operator_views_use():
    settings = Settings.from_env({"EXPORTS_HEARTBEAT_RETENTION_SECONDS": "86400", "EXPORTS_HEARTBEAT_SECONDS": "4"})

    config = PruneConfig.from_settings(settings)

    assert (config.retention_seconds, config.silent_seconds) == (86400.0, SILENT_INTERVALS * 4.0)
