#!/usr/bin/env bash
# `make test-citus`: the Citus tests (tests/tests/citus.rs) against a fresh
# Citus cluster, then a check that no node's server process crashed. The
# tests may restart a worker on purpose, so unlike e2e.sh this does not
# check start times.
#
# The cluster is containers of the project's image when a Docker engine runs
# (the image is built from this checkout first, scripts/docker.sh; the tests
# start the containers themselves, tests/tests/common/cluster.rs), and local
# processes otherwise ("citus-test", scripts/citus.sh). The first line says
# which. LAMBDASTORE_CITUS_CLUSTER=local or =docker chooses. The containers
# are named after this run (lambdastore-citus-test-RUN-coord, -w1, -w2) and
# listen on ports free when they start, so that runs of other checkouts on
# the machine go on beside this one; LAMBDASTORE_CITUS_PORTS=P1,P2,P3 fixes
# the ports (the coordinator's first).
#
# `scripts/e2e-citus.sh --suites` (`make test-citus-suites`) runs instead
# the single-node end-to-end suites (apps, deploy, errors, limits, jobs,
# serializable) a second time, against the coordinator of a fresh local
# citus-test: their objects land on the workers by the hash of their ids,
# so the same assertions cover calls forwarded to the owner node, workflows
# across nodes and jobs run by the workers' runners. Skipped there: tests
# that look at processes, locks and counters of the server they talk to,
# which on a cluster are the owner node's, not the coordinator's (the
# lambda, its locks and its entry sets are there):
#   pg_cancel_backend_stops_*     the coordinator's backend does not run the lambda
#   a_transaction_holds_its_write_locks_*, adaptive_splitting_*,
#   a_calm_object_merges_*, a_workflow_whose_guards_a_*_made_stale_fails
#                                 they read pg_locks, pg_stat_activity and the
#                                 entry-set counters of the coordinator
#                                 (citus.rs has a merge test of its own)
#   a_reader_waits_for_a_committing_writer_*
#                                 it waits for the caller's backend to show
#                                 the wait in pg_stat_activity: on a cluster it
#                                 is the owner node's backend that waits
#
# Without Citus installed (local processes), citus.sh says so in one line
# and this passes, unless LAMBDASTORE_REQUIRE_CITUS=1 (a machine that must
# run them). LAMBDASTORE_REQUIRE_DOCKER=1 fails when the containers cannot be
# had (not with --suites, which uses local processes).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# e2e.sh's packages: built together, their dependencies get the same
# features, and the test binaries here reuse that build (alone, the tests
# package rebuilt some thirty crates: more than a minute in CI).
packages=(-p lambdastore-tests -p lambdastore-gateway -p lambdastore-bench)
citus=$repo/scripts/citus.sh
docker=$repo/scripts/docker.sh
mode=${LAMBDASTORE_CITUS_CLUSTER:-}
suites=
if [ "${1:-}" = --suites ]; then suites=1 mode=local; shift; fi
if [ -z "$mode" ]; then
  if "$docker" engine; then mode=docker; else mode=local; fi
fi
# LAMBDASTORE_IMAGES_BUILT=1: scripts/test-lanes.sh built the images already.
if [ "$mode" = docker ] && [ "${LAMBDASTORE_IMAGES_BUILT:-}" != 1 ] && ! "$docker" build node; then
  [ "${LAMBDASTORE_REQUIRE_DOCKER:-}" = 1 ] && { echo "FAIL: the node image did not build" >&2; exit 1; }
  echo "the node image did not build: the Citus tests run on local processes"
  mode=local
fi
if [ "$mode" = local ] && [ -z "$suites" ] && [ "${LAMBDASTORE_REQUIRE_DOCKER:-}" = 1 ]; then
  echo "FAIL: LAMBDASTORE_REQUIRE_DOCKER=1 but no Docker engine answers" >&2; exit 1
fi

# The crash check: whatever the tests said (a crash can hide behind a
# failing test), once each node's log is complete. The fault test kills a
# backend with SIGKILL on purpose ("signal 9").
crashed() {
  grep -E "terminated by signal|was terminated by exception|PANIC" | grep -v "signal 9: Killed"
}

if [ "$mode" = docker ]; then
  unset LAMBDASTORE_CITUS_WORKER_URLS LAMBDASTORE_CITUS_CRASH
  # This run's name, which the tests give their containers: only these are
  # read and removed here.
  export LAMBDASTORE_CITUS_RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  containers=(lambdastore-citus-test-$LAMBDASTORE_CITUS_RUN-{coord,w1,w2})
  # Held while this run lives: should it be killed, the next run removes
  # its containers (docker.sh claim).
  lock=$("$docker" claim "$LAMBDASTORE_CITUS_RUN") && exec 8>"$lock" && flock 8 || exit 1
  echo "== Citus cluster: containers of lambdastore/postgres:latest (lambdastore-citus-test-$LAMBDASTORE_CITUS_RUN-*), started by the tests (testcontainers)"
  # The containers outlive each test process (tests/tests/common/cluster.rs).
  remove() { docker rm -f "${containers[@]}" >/dev/null 2>&1; }
  trap 'remove; rm -f "$lock"' EXIT
  # One test process, then the containers' logs checked and removed.
  run() {
    local status=0 c
    LAMBDASTORE_CITUS_CLUSTER=docker cargo test "${packages[@]}" --test citus "$@" || status=1
    for c in "${containers[@]}"; do
      if docker logs "$c" 2>&1 | crashed; then
        echo "FAIL: a server process of $c crashed during the tests" >&2; status=1
      fi
    done
    remove
    return $status
  }
  status=0
  run --no-fail-fast -- --skip survive --skip background_ --skip a_dump_of_ "$@" || status=1
  # The fault tests kill and restart workers, the background rebalancer
  # moves every test's objects, a dump needs nothing else writing
  # (docs/operations.md), and a migrated object's timers are timed against
  # moves of their own: alone, one at a time, after the others.
  run -- survive background_ a_dump_of_ --test-threads=1 "$@" || status=1
  [ $status = 0 ] && echo "the containers survived the suite: no crash in their logs"
  exit $status
fi

echo "== Citus cluster: local processes (scripts/citus.sh citus-test)"
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
if [ -n "$suites" ]; then
  echo "== the single-node suites against the coordinator of citus-test"
  # Half the operations in the serializable suite's stress tests: every
  # call crosses nodes here (tests/tests/serializable.rs, `scaled`). Skipped:
  # tests that stage a race by holding this node's locks or its object-id
  # sequence, while the calls they stop run on the workers.
  LAMBDASTORE_TEST_SCALE=${LAMBDASTORE_TEST_SCALE:-0.5} LAMBDASTORE_TEST_URL="$url" \
    cargo test "${packages[@]}" --test apps --test deploy --test errors \
    --test limits --test jobs --test time --test serializable --no-fail-fast -- \
    --skip pg_cancel_backend_stops_ --skip a_transaction_holds_its_write_locks_ --skip adaptive_splitting_ \
    --skip a_calm_object_merges_ --skip a_workflow_whose_guards_a_ --skip a_reader_waits_for_a_committing_writer_ \
    --skip two_sessions_setting_one_timer_ --skip a_workflow_runs_one_version_of_each_application_ \
    "$@"
  status=$?
else
  LAMBDASTORE_CITUS_URL="$url" LAMBDASTORE_TEST_URL="$url" LAMBDASTORE_CITUS_WORKER_URLS="$workers" \
    LAMBDASTORE_CITUS_CRASH="$citus crash-node citus-test" \
    cargo test "${packages[@]}" --test citus --no-fail-fast -- --skip survive --skip background_ --skip a_dump_of_ "$@"
  status=$?
  # The fault tests kill and restart workers, the background rebalancer
  # moves every test's objects, a dump needs nothing else writing
  # (docs/operations.md), and a migrated object's timers are timed against
  # moves of their own: alone, one at a time, after the others.
  LAMBDASTORE_CITUS_URL="$url" LAMBDASTORE_TEST_URL="$url" LAMBDASTORE_CITUS_WORKER_URLS="$workers" \
    LAMBDASTORE_CITUS_CRASH="$citus crash-node citus-test" \
    cargo test "${packages[@]}" --test citus -- survive background_ a_dump_of_ --test-threads=1 "$@" || status=1
fi

# After the stop, so that each log is complete.
"$citus" stop citus-test
for node in $("$citus" nodes citus-test); do
  log=$("$repo/scripts/cluster.sh" log "citus-test-$node")
  if crashed <"$log"; then
    echo "FAIL: a server process of citus-test-$node crashed during the tests (see $log)" >&2; exit 1
  fi
done
echo "citus-test survived the suite: no crash in the logs of its $("$citus" nodes citus-test | wc -l) nodes"
exit $status
