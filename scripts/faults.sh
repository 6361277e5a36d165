#!/usr/bin/env bash
# The fault-injection tests (tests/tests/faults.rs): they SIGKILL job
# runners and restart the server, so they get a fresh cluster of their own
# ("faults"), separate from the one whose survival scripts/e2e.sh checks.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh

url=$("$cluster" fresh faults) || exit 1
trap '"$cluster" stop faults' EXIT
LAMBDASTORE_TEST_URL="$url" LAMBDASTORE_CLUSTER=faults \
  cargo test -p lambdastore-tests --test faults -- --ignored --test-threads=1 --nocapture "$@"
