#!/usr/bin/env bash
# `make test-citus`: the Citus tests (tests/tests/citus.rs) against a fresh
# local Citus cluster, "citus-test" (scripts/citus.sh), then a check that no
# node's server process crashed. The tests may restart a worker on purpose
# (citus.sh crash-node), so unlike e2e.sh this does not check start times.
#
# Without Citus installed, citus.sh says so in one line and this passes,
# unless LAMBDASTORE_REQUIRE_CITUS=1 (a machine that must run them).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
citus=$repo/scripts/citus.sh

url=$("$citus" fresh citus-test)
case $? in
  0) ;;
  3) [ "${LAMBDASTORE_REQUIRE_CITUS:-}" = 1 ] && exit 1; exit 0 ;;
  *) exit 1 ;;
esac
trap '"$citus" stop citus-test' EXIT
workers=$(for node in $("$citus" nodes citus-test | grep -v coord); do "$citus" url citus-test "$node"; done | paste -sd,)

# The coordinator is also LAMBDASTORE_TEST_URL, the server of the helpers
# shared with the other tests (tests/tests/common).
LAMBDASTORE_CITUS_URL="$url" LAMBDASTORE_TEST_URL="$url" LAMBDASTORE_CITUS_WORKER_URLS="$workers" \
  LAMBDASTORE_CITUS_CRASH="$citus crash-node citus-test" \
  cargo test -p lambdastore-tests --test citus --no-fail-fast -- --skip survive "$@"
status=$?
# The fault test kills and restarts workers: alone, after the others.
LAMBDASTORE_CITUS_URL="$url" LAMBDASTORE_TEST_URL="$url" LAMBDASTORE_CITUS_WORKER_URLS="$workers" \
  LAMBDASTORE_CITUS_CRASH="$citus crash-node citus-test" \
  cargo test -p lambdastore-tests --test citus -- survive "$@" || status=1

# Checked whatever the tests said: a crash can hide behind a failing test.
# After the stop, so that each log is complete.
"$citus" stop citus-test
for node in $("$citus" nodes citus-test); do
  log=$("$repo/scripts/cluster.sh" log "citus-test-$node")
  # The fault test kills a backend with SIGKILL on purpose ("signal 9").
  if grep -E "terminated by signal|was terminated by exception|PANIC" "$log" | grep -v "signal 9: Killed"; then
    echo "FAIL: a server process of citus-test-$node crashed during the tests (see $log)" >&2; exit 1
  fi
done
echo "citus-test survived the suite: no crash in the logs of its $("$citus" nodes citus-test | wc -l) nodes"
exit $status
