#!/usr/bin/env bash
# The fault-injection tests (tests/tests/faults.rs): they SIGKILL job
# runners and restart the server, so they get a fresh cluster of their own
# ("faults"), separate from the one whose survival scripts/e2e.sh checks.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# e2e.sh's packages: built together, their dependencies get the same
# features, and the test binaries here reuse that build (alone, the tests
# package rebuilt some thirty crates: more than a minute in CI).
packages=(-p lambdastore-tests -p lambdastore-gateway -p lambdastore-bench)
cluster=$repo/scripts/cluster.sh

url=$("$cluster" fresh faults) || exit 1
trap '"$cluster" stop faults' EXIT
LAMBDASTORE_TEST_URL="$url" LAMBDASTORE_CLUSTER=faults \
  cargo test "${packages[@]}" --test faults -- --ignored --test-threads=1 --nocapture "$@"
