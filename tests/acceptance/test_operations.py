"""Running it for real: each process serves /metrics with values that moved, names its build, and passes
`promtool check metrics` on a live scrape; records a heartbeat that `exports processes` shows, and
`exports health` passes with them running; every process logs JSON lines carrying the job's id when
asked, and no line carries the partner's secret."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import pytest

import app
from app.cli.common import EXIT_UNHEALTHY
from exports_devtools.waiting import wait_until
from tests.acceptance.steps import DEADLINE, create, set_up, wait_status
from tests.fixtures.sftp import free_port
from tests.support import unavailable


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def _sample(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k == prefix or k.startswith(prefix + "{"))


@pytest.fixture
def ports(system) -> dict[str, int]:
    chosen = {"relay": free_port(), "scheduler": free_port(), "worker": free_port()}
    for role, port in chosen.items():
        system.group.env[f"EXPORTS_{role.upper()}_METRICS"] = f"127.0.0.1:{port}"
    system.group.env["EXPORTS_HEARTBEAT_SECONDS"] = "0.5"
    system.group.env["EXPORTS_LOG_FORMAT"] = "json"
    return chosen


def test_each_process_serves_its_metrics_beats_and_logs_json_lines_that_name_the_job(
        system, embedded_sftp, admin, ports):
    set_up(system, embedded_sftp)
    relay_process = system.start_relay()
    worker_process = system.start_worker()
    system.start_scheduler()
    job_id = create(system)
    wait_status(system, admin, job_id, "Completed")

    relay, worker = _scrape(ports["relay"]), _scrape(ports["worker"])
    assert _sample(relay, "exports_relay_published_total") >= 1
    assert worker['exports_claims_total{result="won"}'] >= 1
    assert worker['exports_deliveries_total{outcome="Completed"}'] >= 1
    assert _sample(worker, "dramatiq_messages_total") >= 1
    scheduler = {}

    def scheduler_counts_the_completed_job() -> bool:
        scheduler.update(_scrape(ports["scheduler"]))
        return scheduler.get('exports_jobs{status="Completed"}') == 1

    wait_until(scheduler_counts_the_completed_job, "the scheduler's gauges to count the completed export", DEADLINE)
    assert scheduler["exports_database_up"] == 1 and scheduler["exports_outbox_unpublished"] == 0
    assert {role: scheduler[f'exports_live_processes{{role="{role}"}}'] for role in ("relay", "scheduler", "worker")} \
        == {"relay": 1, "scheduler": 1, "worker": 1}

    listed = system.cli("processes", "--json").json
    assert sorted(p["role"] for p in listed if p["state"] == "alive") == ["relay", "scheduler", "worker"]
    # The pid to signal: a worker process's exports worker (which drains them all), the relay itself.
    alive = {p["role"]: p for p in listed if p["state"] == "alive"}
    assert alive["worker"]["signal_pid"] == worker_process.pid != alive["worker"]["pid"]
    assert alive["relay"]["signal_pid"] == relay_process.pid == alive["relay"]["pid"]
    health = system.cli("health", "--require", "relay,worker,scheduler", "--json").json
    assert health["healthy"] is True, health
    # Liveness, per process, from each one's own endpoint: no notifier runs here (on a port nothing else uses).
    system.group.env["EXPORTS_NOTIFIER_METRICS"] = f"127.0.0.1:{free_port()}"
    for role in ("relay", "worker", "scheduler"):
        assert system.cli("health", "--process", role, "--json").json["healthy"] is True, role
    assert not system.cli("health", "--process", "notifier", "--json", expect=EXIT_UNHEALTHY).json["healthy"]

    lines = [json.loads(line) for line in system.group.logs().splitlines() if line.startswith("{")]
    about_the_job = {line["event"] for line in lines if line.get("job_id") == job_id}
    assert {"runner.claimed", "runner.delivered", "export.processed"} <= about_the_job
    for secret in embedded_sftp.secrets:
        assert secret not in system.group.logs()


def test_health_fails_naming_the_missing_role_when_no_worker_runs(system, embedded_sftp, ports):
    set_up(system, embedded_sftp)
    system.start_relay()
    wait_until(lambda: any(p["role"] == "relay" and p["state"] == "alive"
                           for p in system.cli("processes", "--json").json), "the relay's first heartbeat", DEADLINE)

    result = system.cli("health", "--require", "relay,worker", "--json", expect=EXIT_UNHEALTHY)

    checks = {c["name"]: c for c in result.json["checks"]}
    assert checks["relay processes"]["ok"] and not checks["worker processes"]["ok"]


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        unavailable("promtool is not installed (.ci/install-deploy-tools installs Debian's prometheus)")
    return path


def _ours(body: str) -> str:
    """The exposition without Dramatiq's own families (``dramatiq_*``): their names are Dramatiq's, and one,
    ``dramatiq_message_duration_milliseconds``, is not in base units, which promtool rejects."""
    return "".join(line + "\n" for line in body.splitlines()
                   if not line.startswith(("dramatiq_", "# HELP dramatiq_", "# TYPE dramatiq_")))


def test_a_live_scrape_of_each_process_passes_promtool_check_metrics_and_names_the_build(
        system, embedded_sftp, admin, ports):
    promtool = _promtool()
    set_up(system, embedded_sftp)
    system.start_relay()
    system.start_worker()
    system.start_scheduler()
    wait_status(system, admin, create(system), "Completed")   # the worker's counters have moved

    for role, port in ports.items():
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        checked = subprocess.run([promtool, "check", "metrics"], input=_ours(body).encode(), capture_output=True,
                                 timeout=60)
        problems = (checked.stdout + checked.stderr).decode(errors="replace")
        assert (checked.returncode, problems) == (0, ""), f"{role}:\n{problems}"
        samples = _scrape(port)
        assert samples[f'exports_build_info{{version="{app.__version__}"}}'] == 1, role
    scheduler = _scrape(ports["scheduler"])
    assert scheduler['exports_jobs{status="Completed"}'] == 1 and scheduler['exports_jobs{status="Failed"}'] == 0
