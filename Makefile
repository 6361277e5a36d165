# LambdaStore on PostgreSQL — build, demo and test entry points.
# See README.md and docs/ for the user view, docs/ARCHITECTURE.md for the design.

LAMBDAS      := counter counter_v2 bank forum micro retwis
# Python examples (guest-sdk/python/examples), built to target/lambdas/py_<name>.wasm
# by componentize-py from the virtualenv scripts/setup.sh makes.
PY_LAMBDAS   := counter sandbox forum wallet draws
PYTHON_VENV  := target/python
PY_SDK       := $(wildcard guest-sdk/python/lambdastore/*.py) guest-sdk/python/sitecustomize.py guest-sdk/python/build.sh guest-sdk/wit/lambda.wit
WASM_TARGET  := wasm32-unknown-unknown
LAMBDA_DIR   := target/lambdas
# Cargo's output: CARGO_TARGET_DIR when set (e.g. shared by worktrees).
CARGO_OUT    := $(or $(CARGO_TARGET_DIR),target)
COMPONENTIZE := $(CARGO_OUT)/release/lambdastore-componentize

# Fallbacks, so that a Rust installed a moment ago (rustup, not yet on this
# shell's PATH) and Debian's PostgreSQL 15 are found; a PATH of yours wins.
export PATH := $(PATH):$(HOME)/.cargo/bin:/usr/lib/postgresql/15/bin

# Everything that builds depends on it, so it runs first and once.
.PHONY: setup
setup: ## Install what a fresh Debian 12 lacks: packages (root), wasm target, cargo-pgrx (LAMBDASTORE_SKIP_SETUP=1 skips)
	@scripts/setup.sh

.PHONY: lambdas
lambdas: setup ## Build the example applications to target/lambdas/<name>.wasm (components; Python ones py_<name>.wasm)
	cargo build --release -p lambdastore-componentize
	cargo build --release --target $(WASM_TARGET) $(addprefix -p ,$(LAMBDAS))
	mkdir -p $(LAMBDA_DIR)
	for app in $(LAMBDAS); do \
	  $(COMPONENTIZE) $(CARGO_OUT)/$(WASM_TARGET)/release/$$app.wasm $(LAMBDA_DIR)/$$app.wasm || exit 1; \
	done
	$(MAKE) --no-print-directory $(PY_LAMBDAS:%=$(LAMBDA_DIR)/py_%.wasm)

# A Python example, again only when its sources or the SDK changed (6 s each).
$(LAMBDA_DIR)/py_%.wasm: guest-sdk/python/examples/%/app.py $(PY_SDK)
	@test -x $(PYTHON_VENV)/bin/componentize-py || { echo "no $(PYTHON_VENV)/bin/componentize-py: run scripts/setup.sh" >&2; exit 1; }
	mkdir -p $(LAMBDA_DIR)
	PATH="$(CURDIR)/$(PYTHON_VENV)/bin:$$PATH" guest-sdk/python/build.sh guest-sdk/python/examples/$* $@

PG_CONFIG ?= pg_config

.PHONY: install
install: setup ## Build (release) and install the extension into the server `pg_config` names
	PG_CONFIG=$(PG_CONFIG) scripts/install.sh

.PHONY: test-sdk
test-sdk: lambdas ## The core crate's, SDK, macro and example-app unit tests on the mock host (no database)
	LAMBDASTORE_REQUIRE_LAMBDAS=1 cargo test -p lambdastore-core -p lambdastore-sdk -p lambdastore-sdk-macros -p lambdastore-componentize $(addprefix -p ,$(LAMBDAS))
	$(PYTHON_VENV)/bin/pytest -q -p no:cacheprovider guest-sdk/python

.PHONY: test-e2e
test-e2e: lambdas ## End-to-end tests against a fresh project-owned PostgreSQL
	scripts/e2e.sh
	scripts/faults.sh
	scripts/basebackup.sh
	scripts/upgrade.sh

.PHONY: test-citus
test-citus: lambdas ## The Citus tests on a fresh Citus cluster: containers with a Docker engine, else local processes (skipped without Citus unless LAMBDASTORE_REQUIRE_CITUS=1)
	scripts/e2e-citus.sh

.PHONY: test-citus-suites
test-citus-suites: lambdas ## The single-node end-to-end suites again, against the coordinator of a local Citus cluster (skipped without Citus unless LAMBDASTORE_REQUIRE_CITUS=1)
	scripts/e2e-citus.sh --suites

.PHONY: test-compose
test-compose: lambdas ## docker-compose.yml brought up for real: the forum through the gateway, a worker killed (skipped without a Docker engine unless LAMBDASTORE_REQUIRE_DOCKER=1)
	scripts/e2e-compose.sh

.PHONY: images
images: lambdas ## The images lambdastore/postgres and lambdastore/gateway, with the extension, lambdas and gateway built here
	scripts/docker.sh build

.PHONY: test-faults
test-faults: lambdas ## Only the tests that kill and restart the server (a cluster of their own)
	scripts/faults.sh

.PHONY: check-api
check-api: lambdas ## Run schemathesis (all checks) against a live gateway's /openapi.json (its own cluster)
	scripts/check-api.sh

.PHONY: bench
bench: lambdas install ## The benchmark suite on its own cluster, every system side by side (BENCH_ARGS=... for options)
	scripts/bench.sh $(BENCH_ARGS)

.PHONY: bench-python
bench-python: lambdas install ## A Python guest against a Rust one (the counter): deploy time and size, warm calls (1 and 8 clients), a session's first call
	scripts/bench-python.sh

.PHONY: bench-standby
bench-standby: lambdas install ## Readonly calls on one hot object: the primary alone, then the primary and a hot standby at once (calls/s, CPU per call on each)
	scripts/bench-standby.sh

.PHONY: bench-replicas
bench-replicas: lambdas install ## One hot object on a local Citus cluster with 0, 1 and 2 light replicas (a compute-heavy readonly call; calls/s, the owner's CPU per call a replica serves)
	scripts/bench-replicas.sh

.PHONY: bench-citus
bench-citus: lambdas install ## One node against a local Citus cluster (citus-bench): pgbench workloads (Retwis and CloudForum too), the gateway via the coordinator vs direct to the owner, a migration under load (bench/results/citus-migration.svg), contended calls (16 clients on 3 hot accounts, retries per operation)
	scripts/bench-citus.sh

.PHONY: bench-quick
bench-quick: lambdas install ## The same with scaled-down data and short runs: minutes on 2 cores
	scripts/bench.sh --quick $(BENCH_ARGS)

.PHONY: check-format
check-format: setup ## The workspace is formatted as rustfmt.toml says
	cargo fmt --all -- --check

.PHONY: test
test: check-format lambdas install test-sdk ## Everything CI runs: the suites of test-e2e, test-citus, test-citus-suites and test-compose in two lanes at once, each suite's time at the end (the Citus and compose tests skip without Citus or Docker)
	PG_CONFIG=$(PG_CONFIG) scripts/test-lanes.sh

.PHONY: demo
demo: lambdas install ## Start the embedded single-node PostgreSQL, run the CloudForum demo and its HTTP gateway
	scripts/demo.sh

.PHONY: demo-citus
demo-citus: lambdas install ## The same demo (in SQL) on a local Citus cluster: a coordinator and two workers (needs Citus 13)
	scripts/demo-citus.sh

.PHONY: stop
stop: ## Stop the demo's gateway and the project's PostgreSQL clusters, Citus ones too
	scripts/demo-gateway.sh stop
	scripts/cluster.sh stop demo
	scripts/cluster.sh stop test
	scripts/citus.sh stop citus-demo
	scripts/citus.sh stop citus-test
	scripts/citus.sh stop citus-bench
