"""Every command registers its parser beside its handler, and ``main`` runs it in-process: ``--help``
for each, usage errors, and the one-line answer for a refusal or a surprise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.cli import main as cli_main
from app.cli.common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_REFUSED, EXIT_UNHEALTHY, CliError, Parser
from app.cli.main import COMMAND_MODULES, build_parser, main
from app.config import ConfigError
from app.store.errors import ChangedUnderLock
from exports_devtools.chaos.faults import KINDS
from tests.unit.cli.parsers import leaves

LEAVES = dict(leaves(build_parser()))


@pytest.fixture(autouse=True)
def no_exports_settings(monkeypatch):
    """main reads its settings from the environment: none of the developer's apply here."""
    for key in [k for k in os.environ if k.startswith("EXPORTS_")]:
        monkeypatch.delenv(key)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_version_names_the_release(capsys):
    from app import __version__

    code, out, _ = _run(capsys, "--version")

    assert (code, out.strip()) == (0, f"exports {__version__}")


def test_an_unknown_flag_is_refused_except_by_the_worker_which_passes_it_to_dramatiq(capsys):
    code, _, err = _run(capsys, "list", "--pid-file", "/tmp/x")
    assert code == 2 and "unrecognized arguments: --pid-file /tmp/x" in err

    args, rest = build_parser().parse_known_args(["worker", "-v", "--pid-file", "/tmp/w.pid"])
    assert args.forwards_unknown and rest == ["-v", "--pid-file", "/tmp/w.pid"]


@pytest.mark.parametrize("process", ["relay", "worker"])
def test_a_process_with_a_shared_database_and_no_broker_refuses_to_start_naming_the_setting(
        capsys, monkeypatch, process):
    monkeypatch.setenv("EXPORTS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")

    code, _, err = _run(capsys, process)

    assert code == 2 and err.count("\n") == 1 and "EXPORTS_BROKER_URL" in err


def test_exports_help_lists_every_command_and_exits_zero(capsys):
    code, out, _ = _run(capsys, "--help")

    assert code == 0
    top = {path[0] for path in LEAVES}
    assert top == {"db", "tenant", "destination", "operator", "contacts", "create", "cancel", "edit", "replace",
                   "reconcile", "correct", "show", "list", "watch", "health", "processes", "outbox", "relay",
                   "scheduler", "worker", "notifier", "webhook", "demo", "chaos", "preview", "schedule"}
    assert all(f"    {command}" in out for command in top)


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_has_a_handler_and_its_help_exits_zero(capsys, path):
    assert callable(LEAVES[path].get_default("handler"))

    code, out, err = _run(capsys, *path, "--help")

    assert (code, err) == (0, "")
    assert out.startswith(f"usage: exports {' '.join(path)}") and "exit codes:" in out


@pytest.mark.parametrize("module", COMMAND_MODULES, ids=lambda m: m.__name__)
def test_each_command_module_registers_parsers_for_its_own_handlers(module):
    parser = Parser(prog="exports")

    module.register(parser.add_subparsers(parser_class=Parser))

    handlers = [sub.get_default("handler") for _, sub in leaves(parser)]
    assert handlers and all(h.__module__ == module.__name__ for h in handlers)


def test_no_command_is_a_one_line_usage_error(capsys):
    code, out, err = _run(capsys)

    assert code == EXIT_BAD_INPUT
    assert len(err.splitlines()) == 1 and "COMMAND" in err


def test_a_hostile_argument_is_refused_by_the_parser_before_any_handler_runs(capsys, monkeypatch):
    monkeypatch.setattr(cli_main.tenants, "tenant_add", _must_not_run)

    code, _, err = _run(capsys, "tenant", "add", "\udcff\udcfe bad bytes")

    assert code == EXIT_BAD_INPUT
    assert len(err.splitlines()) == 1 and "not valid UTF-8" in err


@pytest.mark.parametrize("argv, said", [
    (["show", "not-a-uuid", "--tenant", "acme", "--json"], "exports show: error: argument JOB: not a UUID"),
    (["list", "--json", "--bogus"], "exports: error: unrecognized arguments: --bogus"),
    (["cancel", "--json"], "exports cancel: error: the following arguments are required"),
])
def test_a_usage_error_with_json_on_the_command_line_is_one_json_object(capsys, argv, said):
    code, out, err = _run(capsys, *argv)

    assert (code, out) == (EXIT_BAD_INPUT, "")
    [line] = err.splitlines()
    document = json.loads(line)
    assert document["exit_code"] == EXIT_BAD_INPUT and document["error"].startswith(said)


def test_a_usage_error_without_json_is_argparses_one_line_and_json_after_a_double_dash_is_an_argument(capsys):
    code, _, err = _run(capsys, "list", "--bogus")
    assert (code, err) == (EXIT_BAD_INPUT, "exports: error: unrecognized arguments: --bogus\n")

    code, _, err = _run(capsys, "list", "--bogus", "--", "--json")
    assert code == EXIT_BAD_INPUT and err.startswith("exports: error: unrecognized arguments: --bogus")


def test_an_unhealthy_deployment_exits_with_its_own_code_not_a_crashs(capsys, monkeypatch):
    monkeypatch.setenv("EXPORTS_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("EXPORTS_BROKER_URL", "redis://127.0.0.1:1/0")

    code, out, err = _run(capsys, "health", "--json")

    assert (code, err) == (EXIT_UNHEALTHY, "")
    document = json.loads(out)
    assert document["healthy"] is False
    assert document["checks"][0]["detail"].startswith("cannot connect: OperationalError: ")


def test_a_liveness_probe_of_a_process_whose_metrics_are_off_is_bad_input_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("EXPORTS_RELAY_METRICS", "off")

    code, out, err = _run(capsys, "health", "--process", "relay")

    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err == "exports: error: EXPORTS_RELAY_METRICS is off: the relay serves no endpoint to probe\n"


def _must_not_run(ctx, args):
    raise AssertionError("the handler ran")


def test_a_refusal_is_one_line_on_stderr_and_with_json_that_line_is_an_object(capsys, monkeypatch):
    def refuse(ctx, args):
        raise CliError(EXIT_REFUSED, "operator 'mallory' is not allowed", reply="NotAllowed")

    monkeypatch.setattr(cli_main.views, "list_jobs", refuse)

    code, out, err = _run(capsys, "list", "--json")

    assert (code, out) == (EXIT_REFUSED, "")
    assert err.count("\n") == 1 and json.loads(err) == {
        "error": "operator 'mallory' is not allowed", "exit_code": EXIT_REFUSED, "reply": "NotAllowed"}

    code, out, err = _run(capsys, "list")
    assert (code, out, err) == (EXIT_REFUSED, "", "exports: error: operator 'mallory' is not allowed\n")


def test_a_surprise_in_a_handler_is_one_line_and_exit_one_without_a_traceback(capsys, monkeypatch):
    def surprise(ctx, args):
        raise RuntimeError("the disk is on fire\nand here is a second line")

    monkeypatch.setattr(cli_main.views, "list_jobs", surprise)

    code, out, err = _run(capsys, "list")

    assert (code, out) == (EXIT_FAILURE, "")
    assert err == "exports: error: RuntimeError: the disk is on fire\n"


def test_an_application_error_in_a_handler_is_one_line_naming_its_class_and_exit_one(capsys, monkeypatch):
    def changed(ctx, args):
        raise ChangedUnderLock("export 42 changed under its row lock")

    monkeypatch.setattr(cli_main.views, "list_jobs", changed)

    code, out, err = _run(capsys, "list", "--json")

    assert (code, out) == (EXIT_FAILURE, "")
    assert err.count("\n") == 1 and json.loads(err) == {
        "error": "ChangedUnderLock: export 42 changed under its row lock", "exit_code": EXIT_FAILURE}


def test_a_setting_only_the_handler_needs_is_one_line_in_its_own_words_and_exit_two(capsys, monkeypatch):
    def unset(ctx, args):
        raise ConfigError("EXPORTS_RECONCILER_DATABASE_URL is not set")

    monkeypatch.setattr(cli_main.views, "list_jobs", unset)

    code, out, err = _run(capsys, "list")

    assert (code, out, err) == (EXIT_BAD_INPUT, "", "exports: error: EXPORTS_RECONCILER_DATABASE_URL is not set\n")


def test_a_bad_setting_is_one_line_and_exit_two_before_any_handler_runs(capsys, monkeypatch):
    monkeypatch.setenv("EXPORTS_LEASE_SECONDS", "soon")
    monkeypatch.setattr(cli_main.views, "list_jobs", _must_not_run)

    code, _, err = _run(capsys, "list")

    assert code == EXIT_BAD_INPUT
    assert len(err.splitlines()) == 1 and "EXPORTS_LEASE_SECONDS" in err


def test_chaos_names_its_fault_kinds_and_refuses_an_unknown_one_before_starting_anything(capsys, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("EXPORTS_STATE_DIR", str(tmp_path))
    code, out, _ = _run(capsys, "chaos", "--faults", "list")
    assert code == 0 and sorted(out.split()) == sorted(KINDS)

    code, _, err = _run(capsys, "chaos", "--faults", "kill-worker,unplug-the-\x1b[31mcable")
    assert code == 2
    assert "unknown fault kind" in err and "\x1b" not in err and "kill-worker" in err
    assert list(tmp_path.iterdir()) == []   # nothing was started


@pytest.mark.parametrize("flag, value", [("--minutes", "0"), ("--rate", "lots"), ("--faults-per-minute", "-3")])
def test_chaos_refuses_a_malformed_number_with_exit_2(capsys, flag, value):
    code, _, err = _run(capsys, "chaos", flag, value)
    assert code == 2 and flag in err


def test_building_the_command_line_with_its_plugins_imports_no_dramatiq():
    # `exports worker` sets the idle poll dramatiq reads when it is imported; a command module or plugin
    # that imported it at registration would leave every worker on dramatiq's one-second default.
    code = ("import sys; from app.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dramatiq'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
