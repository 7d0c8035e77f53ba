# Two commands for a new user (README.md): `make demo` and `make test`. Each sets everything up first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test setup bench clean

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

bench: setup
	$(VENV)/bin/python -m bench

clean:
	rm -rf $(VENV) var .pytest_cache
