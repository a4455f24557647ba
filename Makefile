# tidemq — the two commands a user needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit bench bench-servers proto servers venv clean screenshots

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test,bench]'
	touch $(STAMP)

venv: $(STAMP)

## Install and run the embedded demo (SQLite + in-process coordination): no servers needed.
demo: $(STAMP)
	$(VENV)/bin/tidemq dev --demo

## Install MariaDB, ZooKeeper, the JDBC driver and the benchmark's peers' servers when missing.
servers:
	bash scripts/install-servers.sh

bench-servers: servers $(STAMP)
	PY=$(PY) bash benchmarks/setup.sh

## The whole suite, the benchmark's smoke run (every scenario at tiny sizes) included.
test: bench-servers
	$(PY) -m pytest -q -p no:cacheprovider

test-unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit tests/behaviour tests/conformance -k "not mysql and not galera and not zookeeper"

## Every benchmark scenario against servers it starts itself (see docs/PERFORMANCE.md); flags via ARGS.
bench: bench-servers
	$(PY) -m benchmarks $(ARGS)

proto: $(STAMP)
	PY=$(PY) bash scripts/gen_proto.sh

clean:
	rm -rf $(VENV) build *.egg-info tidemq-dev.sqlite3*

## Refresh docs/screenshots/ from the console's browser tests (real headless Chromium).
screenshots: servers $(STAMP)
	TIDEMQ_SCREENSHOT_DIR=docs/screenshots $(PY) -m pytest -q -p no:cacheprovider tests/browser
