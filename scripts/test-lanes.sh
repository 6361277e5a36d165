#!/usr/bin/env bash
# `make test`'s server suites, once make has built the extension and the
# lambdas: the test binaries and the images are built first, once, and the
# suites then run in two lanes at once, each suite on servers of its own
# (ports: scripts/cluster.sh, scripts/citus.sh; the containers take free
# ones). Most of a suite's time is waiting (for servers to start, for
# timeouts, for locks), so two lanes fill the machine's cores better than
# one. Each suite's output goes to target/test-logs/SUITE.log, printed
# whole when both lanes are done, then a table of each suite's time.
#
#   scripts/test-lanes.sh            every suite
#   LANES=1 scripts/test-lanes.sh    one after another (for a busy machine)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
logs=$repo/target/test-logs
rm -rf "$logs" && mkdir -p "$logs"
# e2e.sh's packages: every suite runs binaries of this one build.
packages=(-p lambdastore-tests -p lambdastore-gateway -p lambdastore-bench)

# Runs one suite (a command line), its output into its log; one line says
# how it went and how long it took, and the status file records it.
suite() {
  local name=$1 started=$SECONDS status=0
  shift
  "$@" >"$logs/$name.log" 2>&1 || status=$?
  printf '%s %s %s\n' "$name" "$status" "$((SECONDS - started))" >>"$logs/status"
  echo "== $name: $([ $status = 0 ] && echo passed || echo "FAILED ($status)") in $((SECONDS - started)) s"
}

# The build, in the foreground: the lanes then only run what it made.
suite build-tests cargo test "${packages[@]}" --no-run
if [ "$(tail -1 "$logs/status" | cut -d' ' -f2)" != 0 ]; then
  cat "$logs/build-tests.log"; exit 1
fi
if scripts/docker.sh engine; then
  # The gateway image takes the test build's binary (see docker.sh).
  suite build-images env LAMBDASTORE_GATEWAY_BINARY="${CARGO_TARGET_DIR:-$repo/target}/debug/lambdastore-gateway" \
    scripts/docker.sh build
  # Built once for both lanes (e2e-citus.sh and e2e-compose.sh would each
  # rebuild): they skip their own build when told.
  export LAMBDASTORE_IMAGES_BUILT=1
fi

# Lane one: the single server (e2e, then the tests that kill and restart
# servers, the physical backup, the upgrade), then the compose cluster.
# Lane two: the Citus tests, then the single-node suites on Citus. About
# as long as each other on this machine (2 cores).
single() {
  suite e2e scripts/e2e.sh
  suite faults scripts/faults.sh
  suite basebackup scripts/basebackup.sh
  suite upgrade scripts/upgrade.sh
  suite compose scripts/e2e-compose.sh
}
cluster() {
  suite citus scripts/e2e-citus.sh
  suite citus-suites scripts/e2e-citus.sh --suites
}
if [ "${LANES:-2}" = 1 ]; then
  single
  cluster
else
  single &
  cluster &
  wait
fi

for log in "$logs"/*.log; do
  echo
  echo "==================== ${log##*/} ===================="
  cat "$log"
done
echo
echo "== suite times (s), two lanes at once: $(cut -d' ' -f1,3 "$logs/status" | paste -sd' ')"
failed=$(awk '$2 != 0 { print $1 }' "$logs/status" | paste -sd' ')
[ -z "$failed" ] || { echo "FAILED: $failed (logs in $logs)"; exit 1; }
echo "every suite passed"
