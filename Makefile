# Acthelm — `make run` starts everything on the embedded PostgreSQL; `make test` runs the whole suite.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
# gunicorn threads per process (`make serve`): a live stream of a task holds one while open.
WEB_THREADS ?= 16
DEMO_MODEL_PORT ?= 8765
PYTEST_ARGS ?=
# The suite runs in this many processes (each with its own test database); the tests marked
# serial (the chaos test restarts the embedded PostgreSQL) run alone afterwards. Four on two
# cores: most of the suite waits on worker processes, leases, sockets and browsers, so more
# processes than cores overlap the waits (8 min 36 s against 15 min 20 s with two, same machine).
PYTEST_WORKERS ?= 4
# Python keeps the bytecode it compiles (gitignored __pycache__ folders) even where the shell
# says not to: the suite starts some hundreds of Python processes (workers, commands, servers),
# and each one compiling the project's ~160 modules again cost ~0.3 s of CPU, each pytest
# process's collection rewriting every test module again ~5 s.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test venv migrate demo worker lint fmt chromium pgbouncer screenshots db-stop stop clean

# Exact versions come from requirements.lock (a pip constraints file); `make lock` rewrites it.
LOCK := requirements.lock

$(STAMP): pyproject.toml $(LOCK)
	@set -e; \
	if [ ! -x $(PY) ]; then \
		py=$$(bin/find-python) || exit 1; \
		echo "Creating $(VENV) with $$py"; \
		"$$py" -m venv $(VENV); \
	fi; \
	$(PY) -m pip install -q --upgrade pip; \
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev]'; \
	touch $(STAMP)

# Re-resolve the dependencies of pyproject.toml (and the dev extra) in a clean environment and
# pin what was installed. Run it after changing a dependency; commit requirements.lock.
.PHONY: lock
lock:
	@set -e; \
	py=$$(bin/find-python) || exit 1; \
	rm -rf var/lock-venv; \
	"$$py" -m venv var/lock-venv; \
	var/lock-venv/bin/python -m pip install -q --upgrade pip; \
	var/lock-venv/bin/python -m pip install -q '.[dev]'; \
	{ echo "# Exact versions for pip install -c $(LOCK); written by 'make lock' from pyproject.toml."; \
	  var/lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^acthelm'; } > $(LOCK); \
	rm -rf var/lock-venv build; \
	echo "$(LOCK): $$(grep -vc '^#' $(LOCK)) pinned packages"

venv: $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

demo: migrate
	ACTHELM_DEMO_MODEL_PORT=$(DEMO_MODEL_PORT) $(PY) manage.py acthelm_demo \
		--console-url http://$(HOST):$(PORT)/

# The console on $(HOST):$(PORT), one worker and the scripted demo model; one Ctrl-C stops
# them: bin/run-demo sends each one SIGTERM once and waits for all three.
run: demo
	@$(PY) bin/run-demo --host $(HOST) --port $(PORT) --demo-model-port $(DEMO_MODEL_PORT)

worker: migrate
	$(PY) manage.py acthelm_worker

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "Installing Debian's chromium for the browser tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
		|| echo "WARNING: could not install chromium; the browser tests will fail"; }

# The worker's tests behind a real pooler (tests/agents/test_worker_pgbouncer.py) start Debian's
# PgBouncer themselves; without it they are skipped.
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || { \
		echo "Installing Debian's pgbouncer for the tests behind a connection pooler"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer) >/dev/null \
		|| echo "WARNING: could not install pgbouncer; the tests behind a pooler will be skipped"; }

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	@# Strict types on every package but the migrations ([tool.mypy] in pyproject.toml). The
	@# settings module is imported by django-stubs; any DATABASE_URL keeps it from starting a server.
	DATABASE_URL=postgresql://mypy@127.0.0.1:1/unused $(VENV)/bin/mypy \
		core memory tasks approvals agents schedules console acthelm_site --exclude '/migrations/'

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: $(STAMP) chromium pgbouncer lint
	$(PY) manage.py makemigrations --check --dry-run
	@# Exit status 5 is "no test selected" (PYTEST_ARGS may name only serial tests, or none).
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Refreshes the README's screenshots from the browser tests' real pages.
screenshots: $(STAMP) chromium
	ACTHELM_SCREENSHOTS=1 $(PY) -m pytest tests/e2e -q

# Stops the embedded PostgreSQL (it keeps running between commands so workers and tests share it).
db-stop stop: $(STAMP)
	$(PY) -m core.embedded_pg stop

clean: db-stop
	rm -rf $(VENV) .pgdata var

# The console under gunicorn with the production settings, on $(HOST):$(PORT) behind a
# TLS-terminating proxy. Needs DJANGO_SECRET_KEY and DATABASE_URL; see docs/operations.md.
.PHONY: serve
serve: $(STAMP)
	DJANGO_SETTINGS_MODULE=acthelm_site.settings_production $(PY) manage.py collectstatic --noinput
	DJANGO_SETTINGS_MODULE=acthelm_site.settings_production exec $(PY) -m gunicorn acthelm_site.wsgi --threads $(WEB_THREADS) \
		--bind $(HOST):$(PORT) --access-logfile -

# Benchmarks against the peers (Procrastinate, LangGraph), measured side by side on the project's
# PostgreSQL; each script prints its table and rewrites its section of bench/README.md.
.PHONY: bench chaos
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) bench/dispatch.py
	$(PY) bench/steps.py
	$(PY) bench/boundary.py
	$(PY) bench/wakeup.py
	$(PY) bench/console.py

# The full chaos run (the short one is part of `make test`): 300 tasks, 4 workers, a random worker
# SIGKILLed every 2 s for 60 s, PostgreSQL restarted once (embedded server only).
chaos: $(STAMP)
	CHAOS_TASKS=300 CHAOS_WORKERS=4 CHAOS_SECONDS=60 CHAOS_SETTLE_SECONDS=600 \
		$(PY) -m pytest tests/chaos -q -s
