"""The shipped deployment files (deploy/) agree with the code they run: each unit starts the process it is
named after, with our environment file, a state directory, KillMode=mixed and a stop timeout a worker's
drain fits in; the environment example names only settings the processes read, and those it sets are
accepted; the Procfile runs the four processes; docs/operations.md points at the files rather than
holding copies. The tools made for them check them too (.ci/check-deploy: systemd-analyze, promtool)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.actors.draining import DEADLINE_GRACE_SECONDS
from app.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROCESSES = ("relay", "worker", "scheduler", "notifier")


def _unit(process: str) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / f"exports-{process}.service").read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            directives.setdefault(key, []).append(value)
    return directives


@pytest.mark.parametrize("process", PROCESSES)
def test_each_unit_runs_its_process_from_our_environment_file_in_its_state_directory(process):
    unit = _unit(process)
    assert unit["ExecStart"] == [f"/opt/exports/venv/bin/exports {process}"]
    assert unit["EnvironmentFile"] == ["/etc/crm-exports/exports.env"]   # not /etc/exports: NFS's
    assert unit["StateDirectory"] == ["exports"] and unit["WorkingDirectory"] == ["/var/lib/exports"]
    assert "EXPORTS_STATE_DIR=/var/lib/exports" in unit["Environment"]
    assert unit["Wants"] == ["network-online.target"] and "network-online.target" in unit["After"][0].split()
    assert unit["KillMode"] == ["mixed"] and unit["User"] == ["exports"]


def test_the_worker_unit_waits_longer_than_a_workers_drain_and_its_deadline_before_it_kills():
    drain = Settings().worker_stop_seconds + DEADLINE_GRACE_SECONDS
    assert int(_unit("worker")["TimeoutStopSec"][0]) > drain


def test_the_environment_example_names_only_settings_the_processes_read_and_sets_values_they_accept():
    text = (DEPLOY / "exports.env.example").read_text()
    named = set(re.findall(r"^#?(EXPORTS_[A-Z_]+)=", text, re.M))
    read = set(re.findall(r'"(EXPORTS_[A-Z_]+)"', (ROOT / "app" / "config.py").read_text()))
    assert named and named <= read, named - read
    assert not re.search(r"^[A-Z_]+=.*\s#", text, re.M), "a comment after a value becomes part of it"
    env = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert Settings.from_env(env).log_format == "json"


def test_the_procfile_runs_the_four_processes():
    lines = [line.split(":", 1) for line in (DEPLOY / "Procfile").read_text().splitlines() if line.strip()]
    assert {name: command.strip() for name, command in lines} == {p: f"exports {p}" for p in PROCESSES}


def test_the_operations_guide_points_at_the_deployment_files_instead_of_holding_copies():
    guide = (ROOT / "docs" / "operations.md").read_text()
    for path in ("deploy/systemd/exports-worker.service", "deploy/exports.env.example", "deploy/Procfile",
                 "deploy/prometheus/exports-rules.yml", "deploy/prometheus/prometheus.yml"):
        assert path in guide, path
    assert "[Service]" not in guide and "groups:" not in guide
