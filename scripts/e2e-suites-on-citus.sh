#!/usr/bin/env bash
# `make test-citus-suites`: the single-node end-to-end suites (apps, deploy,
# errors, limits, jobs, serializable) a second time, against the coordinator
# of a fresh 3-node Citus cluster of local processes ("citus-test",
# scripts/citus.sh). Their objects land on the workers by the hash of their
# ids, so the same assertions now cover calls forwarded to the owner node,
# workflows across nodes and jobs run by the workers' runners.
#
# Skipped here: they look at processes, locks and counters of the server
# they talk to, which on a cluster are the owner node's, not the
# coordinator's (the lambda, its locks and its entry sets are there):
#   pg_cancel_backend_stops_*     the coordinator's backend is not the one running the lambda
#   a_transaction_holds_its_write_locks_*, adaptive_splitting_*,
#   a_workflow_whose_guards_a_split_made_stale_fails
#                                 they read pg_locks, pg_stat_activity and the
#                                 entry-set counters of the coordinator
#
# Without Citus installed it says so in one line and passes, unless
# LAMBDASTORE_REQUIRE_CITUS=1.
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
echo "== the single-node suites against the coordinator of citus-test ($url)"
suites=(--test apps --test deploy --test errors --test limits --test jobs --test serializable)
LAMBDASTORE_TEST_URL="$url" cargo test -p lambdastore-tests "${suites[@]}" --no-fail-fast -- \
  --skip pg_cancel_backend_stops_ \
  --skip a_transaction_holds_its_write_locks_ --skip adaptive_splitting_ \
  --skip a_workflow_whose_guards_a_split_made_stale_fails "$@"
status=$?

"$citus" stop citus-test
for node in $("$citus" nodes citus-test); do
  log=$("$repo/scripts/cluster.sh" log "citus-test-$node")
  if grep -E "terminated by signal|was terminated by exception|PANIC" "$log"; then
    echo "FAIL: a server process of citus-test-$node crashed during the suites (see $log)" >&2; exit 1
  fi
done
echo "citus-test survived the suites: no crash in the logs of its $("$citus" nodes citus-test | wc -l) nodes"
exit $status
