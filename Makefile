# Two commands for a new user (README.md): `make demo` and `make test`. Each sets everything up first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test setup bench bench-full clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("exports needs Python 3.11 or newer") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(VENV)/bin/exports demo

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The bench extra (matplotlib, the peer queues, a profiler) only for the benchmarks. Both write
# bench/results/<date>.json and regenerate docs/benchmarks.md; `bench` is the quick run (under 10 minutes).
$(BENCH_STAMP): $(STAMP)
	$(VENV)/bin/python -m pip install --quiet -e '.[test,bench]'
	rm -f $(VENV)/.bench-*
	touch $@

bench: $(BENCH_STAMP)
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

bench-full: $(BENCH_STAMP)
	$(VENV)/bin/python -m bench --full $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache
