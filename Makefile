# The two set-up commands of the README: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install install-dev run test lint bench clean

$(STAMP): pyproject.toml setup.py scripts/bootstrap.sh src/eventspark/sdk.py $(wildcard src/eventspark/speedups/*.pyx)
	bash scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev]'  # dev pulls every driver extra (eventspark[all])
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

run: install
	$(VENV)/bin/eventspark serve $(if $(CONFIG),-c $(CONFIG),)

test: install-dev
	bash scripts/test-services.sh
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: install-dev
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

bench: install-dev
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) bench/steps.py
	$(PY) bench/batch.py --dlt-events 100000

clean:
	rm -rf $(VENV) build *.egg-info src/eventspark/speedups/*.c src/eventspark/speedups/*.so
