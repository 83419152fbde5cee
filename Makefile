# Sluice — every target creates and uses .venv itself, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Every target installs exactly the versions in requirements/lock.txt (hashes checked); `make lock` refreshes it.
LOCK := requirements/lock.txt
RUNTIME_LOCK := requirements/runtime.txt
UV_COMPILE := $(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock'

.PHONY: venv test unit integration fuzz lint proto bench demo image clean test-failover test-crash lock soak

# The lock holds pip, setuptools and wheel too: the venv's own pip installs them first, and the editable install of
# Sluice is built without isolation by the locked setuptools (no build dependency is fetched unpinned).
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

## make lock: re-resolve the lock from pyproject.toml's ranges (the newest releases they allow), reinstall the venv
## from it and regenerate the gRPC stubs with the locked grpcio-tools; review and commit all three
lock: $(STAMP)
	$(UV_COMPILE) --upgrade pyproject.toml requirements/tools.in --all-extras -o $(LOCK)
	$(UV_COMPILE) pyproject.toml --constraint $(LOCK) -o $(RUNTIME_LOCK)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(PY) -m broker.proto.build
	touch $(STAMP)

## make proto: regenerate the gRPC stubs from broker/proto/sluice.proto
proto: $(STAMP)
	$(PY) -m broker.proto.build

## make lint: ruff, mypy and the import contracts between rooms (pyproject.toml's [tool.importlinter])
lint: $(STAMP)
	$(VENV)/bin/ruff check broker connector streaming_jobs tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

## make test: lint, then the whole suite: the unit suite, and beside it the short soak, then the integration suite
## (scripts/test.sh says why two streams)
test: lint
	bash scripts/test.sh $(PYTEST_ARGS)

## make test-failover: the long replication fault loop (50 SIGKILLs of the master under SYNC load, 3 replicas)
## beside the replication suite; FAILOVERS=N to change the count
FAILOVERS ?= 50
test-failover: $(STAMP)
	bash scripts/ensure-etcd.sh
	SLUICE_LONG_FAILOVERS=$(FAILOVERS) $(PY) -m pytest tests/unit/ha -q -s $(PYTEST_ARGS)

## make soak: every feature through every fault at once (tests/soak: a replicated group under controller mode, two
## more brokers, producers and consumers of every kind, faults drawn from a seed), checked at the end; the seed, the
## schedule and the report in bench/results/soak.json. SOAK_MINUTES=N (default 5), SOAK_SEED=S to re-run a seed.
SOAK_MINUTES ?= 5
soak: $(STAMP)
	bash scripts/ensure-etcd.sh
	SOAK_MINUTES=$(SOAK_MINUTES) $(if $(SOAK_SEED),SOAK_SEED=$(SOAK_SEED)) $(PY) -m tests.soak

## make test-crash: the Spark crash loops at full length (more driver kills over more messages than in `make test`,
## more queries stopped mid-start)
test-crash: $(STAMP)
	SLUICE_LONG_CRASHES=1 $(PY) -m pytest tests/unit/connector/test_exactly_once.py \
		tests/unit/connector/test_sink_exactly_once.py tests/unit/connector/test_cluster_exactly_once.py \
		tests/unit/connector/test_query_stop.py -q -s $(PYTEST_ARGS)

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

integration: $(STAMP)
	bash scripts/test.sh tests/integration $(PYTEST_ARGS)

## make fuzz: the long fuzz run of a broker process (15x the examples of the one in `make test`, random rather
## than fixed, SIGKILL between families): its Sluice, transaction coordinator and RocketMQ 5 services; about 20
## minutes on 2 cores
fuzz: $(STAMP)
	SLUICE_FUZZ_LONG=1 $(PY) -m pytest tests/unit/fuzz -q -s $(PYTEST_ARGS)

## make bench: every benchmark (the lock includes the bench extra's peers' clients); tables on stdout, JSON (and charts) in bench/results/
bench: $(STAMP)
	$(PY) -m bench

## make demo: the main job on a broker it starts as a child process
demo: $(STAMP)
	$(PY) -m streaming_jobs.demo

## make image: the broker image sluice-broker:latest, with or without a registry (starts a Docker engine if needed)
image: $(STAMP)
	SLUICE_SKIP_IMAGE_BUILD=1 bash scripts/ensure-docker.sh
	bash scripts/build-image.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
