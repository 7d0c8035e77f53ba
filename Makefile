# Two commands for a new user (README.md): `make demo` and `make test`. Each sets everything up first,
# installing the exact versions in constraints.txt (`make lock` refreshes them).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml devtools/pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml devtools/pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
PIP := $(VENV)/bin/python -m pip

.PHONY: demo test lint setup bench bench-full lock clean

setup: $(STAMP)

$(STAMP): pyproject.toml devtools/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit("exports needs Python 3.11 or newer") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[test]' -e ./devtools
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(VENV)/bin/exports demo

# Across the cores, and beyond them: most tests wait on servers and subprocesses. Each pytest-xdist worker
# has its own PostgreSQL, or Redis database numbers of its own on a configured server (tests/conftest.py).
# TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 4
test: setup
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The linter, the layer contract (pyproject.toml's [tool.importlinter]) and the type checker, as CI runs them.
lint: setup
	$(VENV)/bin/ruff check app devtools tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The bench extra (matplotlib, the peer queues, a profiler) only for the benchmarks. Both write
# bench/results/<date>.json and regenerate docs/benchmarks.md; `bench` is the quick run (under 10 minutes).
$(BENCH_STAMP): $(STAMP)
	$(PIP) install --quiet -c constraints.txt -e '.[test,bench]' -e ./devtools
	rm -f $(VENV)/.bench-*
	touch $@

bench: $(BENCH_STAMP)
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

bench-full: $(BENCH_STAMP)
	$(VENV)/bin/python -m bench --full $(BENCH_ARGS)

# Re-resolves every dependency (all extras) in a scratch environment and pins the result.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet '.[test,bench]' ./devtools
	(echo '# The exact versions make and CI install (pip -c). Regenerate with "make lock" after changing a'; echo '# dependency in pyproject.toml; review the diff, run "make test", commit both.'; .lock-venv/bin/python -m pip freeze --exclude exports --exclude exports-devtools) > constraints.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) var .pytest_cache .lock-venv
