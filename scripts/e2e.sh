#!/usr/bin/env bash
# End-to-end tests: a fresh project-owned cluster with the installed
# extension; the Rust tests in tests/, the gateway's HTTP tests in
# gateway/tests/ and the bench's baseline-equivalence tests against it; and
# a final check that no backend crashed and the server never restarted.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh

url=$("$cluster" fresh test) || exit 1
trap '"$cluster" stop test' EXIT
log=$("$cluster" log test)
started=$("$cluster" psql test -d postgres -Atc "SELECT pg_postmaster_start_time()")

# The bench's report tests draw PNG plots here, so a missing font fails them.
# tests/tests/citus.rs skips here: it runs against a Citus cluster in
# scripts/e2e-citus.sh, where LAMBDASTORE_REQUIRE_CITUS applies.
LAMBDASTORE_REQUIRE_FONTS=1 LAMBDASTORE_TEST_URL="$url" env -u LAMBDASTORE_REQUIRE_CITUS cargo test -p lambdastore-tests -p lambdastore-gateway -p lambdastore-bench --no-fail-fast "$@"
status=$?

# Checked whatever the tests said: a crash can hide behind a failing test.
after=$("$cluster" psql test -d postgres -Atc "SELECT pg_postmaster_start_time()")
if [ "$started" != "$after" ]; then
  echo "FAIL: the server restarted during the tests ($started -> $after)" >&2; exit 1
fi
if grep -E "terminated by signal|was terminated by exception|PANIC" "$log"; then
  echo "FAIL: a server process crashed during the tests (see $log)" >&2; exit 1
fi
echo "server survived the suite: started $started, no crash in the log"
exit $status
