# Two commands for a new machine: `make demo` and `make test`. Each creates .venv if missing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# fastdup (CC BY-NC-ND 4.0, non-commercial; README "Licences") is installed unless WITH_FASTDUP=0:
# curation then runs on the project's own code, without fastdup's model and galleries.
WITH_FASTDUP ?= 1
REQ_FILES := requirements.txt requirements-dev.txt requirements-alibi-detect.txt requirements-fastdup.txt constraints.txt pyproject.toml
REQ_HASH := $(shell cat $(REQ_FILES) | sha256sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(REQ_HASH)-fastdup$(WITH_FASTDUP)

# Embedded defaults: everything under .cd4ml/, SQLite for Airflow and MLflow, no server.
export CD4ML_ENV ?= sit
export CD4ML_HOME ?= $(CURDIR)/.cd4ml
export AIRFLOW_HOME ?= $(CD4ML_HOME)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export FASTDUP_PRODUCTION := 1
export GIT_PYTHON_REFRESH := quiet
export PYTHONPATH := $(CURDIR):$(CURDIR)/plugins
export PATH := $(CURDIR)/$(BIN):$(PATH)
DEMO_DATE ?= 2026-11-21
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv demo demo-photos demo-serving test test-nofastdup test-stack test-all test-fast browser-deps up up-scaleout down topology topology-down ui bench lock clean

venv: $(STAMP)

# alibi-detect and fastdup go in with --no-deps: their metadata pins Pillow below requirements.txt's
# (docs/data.md, "Pillow"); their other requirements are pinned in the files, and
# tests/test_dependencies.py fails on anything unmet but those two Pillow pins.
$(STAMP): $(REQ_FILES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-alibi-detect.txt
ifeq ($(WITH_FASTDUP),0)
	$(BIN)/pip uninstall --quiet --yes fastdup 2>/dev/null || true
else
	$(BIN)/pip install --quiet --no-deps -r requirements-fastdup.txt
endif
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-* && touch $@

## The main job on embedded defaults: sample digits -> ingest -> validate -> curate -> drift -> train -> gate -> registry.
demo: $(STAMP)
	$(BIN)/cd4ml sample-data --with-bad-files
	$(BIN)/airflow db migrate > /dev/null
	$(BIN)/airflow dags test cd4ml_ingest $(DEMO_DATE)
	$(BIN)/airflow dags test cd4ml_curate $(DEMO_DATE)
	$(BIN)/airflow dags test cd4ml_train $(DEMO_DATE)
	$(BIN)/cd4ml summary

## Optional: the same chain on the colour sample (photo tiles, classes discovered), in its own home .cd4ml-photos/.
demo-photos: $(STAMP)
	export CD4ML_DATASET=photos CD4ML_HOME=$(CURDIR)/.cd4ml-photos AIRFLOW_HOME=$(CURDIR)/.cd4ml-photos/airflow; \
	$(BIN)/cd4ml sample-data --dataset photos --with-bad-files && \
	$(BIN)/airflow db migrate > /dev/null && \
	$(BIN)/airflow dags test cd4ml_ingest $(DEMO_DATE) && \
	$(BIN)/airflow dags test cd4ml_curate $(DEMO_DATE) && \
	$(BIN)/airflow dags test cd4ml_train $(DEMO_DATE) && \
	$(BIN)/cd4ml summary

## Optional, after `make demo`: the champion at work: score a day of scans, load their later labels, monitor.
demo-serving: $(STAMP)
	$(BIN)/cd4ml sample-data --scoring
	$(BIN)/airflow dags test cd4ml_score $(DEMO_DATE)
	$(BIN)/airflow dags test cd4ml_monitor $(DEMO_DATE)
	@echo "dashboard: $$(ls -d $(CD4ML_HOME)/$(CD4ML_ENV)/reports/monitoring/*/v*/*/index.html | tail -1)"

## Unit tests, DAG integrity tests and whole-DAG runs in a temporary AIRFLOW_HOME (under 20 min on 2 cores).
## TEST_PROCESSES pytest processes (pytest-xdist), a test file per process at a time; TEST_PROCESSES=0: one process.
TEST_PROCESSES ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadfile --durations=15 \
	  -m "not stack and not browser"

## The install without fastdup (WITH_FASTDUP=0, its own .venv-nofastdup): the curation tests, the dependency
## check and the fastdup-free tests run there (README "Licences"; the time it adds: bench/README.md).
test-nofastdup:
	$(MAKE) venv VENV=.venv-nofastdup WITH_FASTDUP=0
	.venv-nofastdup/bin/python -m pytest -q -p no:cacheprovider --durations=5 -m "not stack and not browser" \
	  tests/tasks/curation tests/test_dependencies.py

## The running stacks: `cd4ml up` in scale-out mode (PostgreSQL, Redis, Celery workers, MLflow server) with a
## worker killed mid-task and auth refusals, the Airflow UI in headless Chromium (installed from Debian if missing),
## the release and deadline DAGs under a real scheduler and API server (approvals, timeouts, rollback), and sit, uat
## and prod as three running deployments (`cd4ml topology up`: a model walked from sit to prod by events).
## In TEST_PROCESSES processes, a test file per process at a time: the three deployments (one file, its stacks
## started once) beside the other stacks. (Not --dist loadgroup: pytest-xdist 3.8.0's groups do nothing under pytest 9.2.)
test-stack: $(STAMP) browser-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_PROCESSES) --dist loadfile --durations=10 \
	  -m "stack or browser"

test-all: test test-stack

browser-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "installing Debian's chromium and chromium-driver for the browser test"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver; }

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not airflow and not server"

## Airflow's real services on the embedded defaults (SQLite, LocalExecutor sized to this machine); Ctrl-C stops all.
up: $(STAMP)
	$(BIN)/cd4ml up

## The scale-out mode on this machine's PostgreSQL and Redis: CeleryExecutor, two workers, FAB auth, MLflow server.
up-scaleout: $(STAMP)
	CD4ML_STACK=scaleout $(BIN)/cd4ml up

down: $(STAMP)
	$(BIN)/cd4ml down; CD4ML_STACK=scaleout $(BIN)/cd4ml down

## sit, uat and prod as three scale-out stacks (Airflow :8080/:8081/:8082, MLflow :5000/:5001/:5002), each with
## its sample data; a model travels between them by event (README "From sit to prod"). Ctrl-C stops all three.
topology: $(STAMP)
	$(BIN)/cd4ml topology up --sample-data

topology-down: $(STAMP)
	$(BIN)/cd4ml topology down

## The same as `make up` (it used to be `airflow standalone`, which starts 32 worker processes).
ui: up

bench: $(STAMP)
	$(BIN)/python bench/dag_parse.py

## Re-pin constraints.txt from the current environment (after changing a requirements file). The lock is
## taken from the full install (with fastdup), so WITH_FASTDUP=0 installs a subset of it; setuptools is
## pinned too (fastdup and torch require it), pip is not.
lock:
	@$(BIN)/python -c "import importlib.metadata as m; m.version('fastdup')" 2>/dev/null \
	  || { echo "make lock needs the full install: make venv WITH_FASTDUP=1"; exit 1; }
	$(BIN)/pip freeze --all --exclude-editable | grep -v -E '^(cd4ml|pip)==' | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/' > constraints.txt

clean:
	rm -rf $(CD4ML_HOME) $(CURDIR)/.cd4ml-photos
