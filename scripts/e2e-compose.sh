#!/usr/bin/env bash
# `make test-compose`: docker-compose.yml brought up for real. Builds the
# images from this checkout (scripts/docker.sh), starts the cluster as a
# compose project of its own, runs tests/tests/compose.rs against it (the
# forum through the gateway, calls on the owner nodes, a worker container
# killed and started again), checks the nodes' logs for crashes and removes
# everything, volumes included, whatever happened.
#
# The project is named after this run (lambdastore-compose-test-RUN), and
# its coordinator, workers and gateway listen on ports free when it starts,
# so that a `docker compose up` of yours, and runs of other checkouts on the
# machine, go on beside it; only this project is read and brought down.
# LAMBDASTORE_COMPOSE_PORTS=COORDINATOR,WORKER1,WORKER2,GATEWAY fixes the
# ports.
#
# Without a Docker engine it says so in one line and passes, unless
# LAMBDASTORE_REQUIRE_DOCKER=1 (CI), where it fails.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
docker=$repo/scripts/docker.sh

if ! "$docker" engine; then
  if [ "${LAMBDASTORE_REQUIRE_DOCKER:-}" = 1 ]; then
    echo "FAIL: LAMBDASTORE_REQUIRE_DOCKER=1 but no Docker engine answers (docker info)" >&2; exit 1
  fi
  echo "skipped: the compose test needs a Docker engine, and none answers (docker info)"
  exit 0
fi
# LAMBDASTORE_IMAGES_BUILT=1: scripts/test-lanes.sh built the images already.
[ "${LAMBDASTORE_IMAGES_BUILT:-}" = 1 ] || "$docker" build || exit 1

ports=${LAMBDASTORE_COMPOSE_PORTS:-$("$docker" free-ports 4)} || exit 1
[[ $ports =~ ^[0-9]+,[0-9]+,[0-9]+,[0-9]+$ ]] || {
  echo "LAMBDASTORE_COMPOSE_PORTS is COORDINATOR,WORKER1,WORKER2,GATEWAY, not $ports" >&2; exit 2
}
IFS=, read -r LAMBDASTORE_COORDINATOR_PORT LAMBDASTORE_WORKER1_PORT LAMBDASTORE_WORKER2_PORT \
  LAMBDASTORE_GATEWAY_PORT <<<"$ports"
export LAMBDASTORE_COORDINATOR_PORT LAMBDASTORE_WORKER1_PORT LAMBDASTORE_WORKER2_PORT LAMBDASTORE_GATEWAY_PORT
run=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
project=lambdastore-compose-test-$run
# Held while this run lives: should it be killed, the next run brings its
# project down (docker.sh claim).
lock=$("$docker" claim "$run") && exec 8>"$lock" && flock 8 || exit 1
echo "== compose project $project: the coordinator on $LAMBDASTORE_COORDINATOR_PORT, the workers on" \
  "$LAMBDASTORE_WORKER1_PORT and $LAMBDASTORE_WORKER2_PORT, the gateway on $LAMBDASTORE_GATEWAY_PORT"
compose=("$docker" compose -p "$project" -f "$repo/docker-compose.yml")
down() { "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1; rm -f "$lock"; }
trap down EXIT

gateway=http://127.0.0.1:$LAMBDASTORE_GATEWAY_PORT
started=$(date +%s%N)
if ! "${compose[@]}" up -d --no-build; then
  "${compose[@]}" logs --no-color --tail 20 >&2; exit 1
fi
# up returns once the gateway's container runs (after the init exited 0):
# ready is when it answers /readyz.
deadline=$((SECONDS + 120))
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$gateway/readyz")" = 200 ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "FAIL: the gateway is not ready 120 s after up" >&2; "${compose[@]}" logs --no-color --tail 20 >&2; exit 1
  fi
  sleep 0.2
done
echo "== the compose cluster answers $(( ($(date +%s%N) - started) / 1000000 )) ms after up"

key=$("${compose[@]}" logs --no-color init | grep -o 'lsk_[0-9a-f]*' | tail -1)
url() { echo "host=127.0.0.1 port=$1 user=postgres dbname=lambdastore"; }
LAMBDASTORE_COMPOSE_GATEWAY=$gateway LAMBDASTORE_COMPOSE_KEY=$key \
  LAMBDASTORE_COMPOSE_URL=$(url "$LAMBDASTORE_COORDINATOR_PORT") \
  LAMBDASTORE_COMPOSE_WORKER_URLS="$(url "$LAMBDASTORE_WORKER1_PORT"),$(url "$LAMBDASTORE_WORKER2_PORT")" \
  LAMBDASTORE_COMPOSE="${compose[*]}" \
  cargo test -p lambdastore-tests -p lambdastore-gateway -p lambdastore-bench --test compose -- --test-threads=1 "$@"
status=$?

# A crash can hide behind a failing test. The killed worker's processes all
# died at once, which no log line reports.
if "${compose[@]}" logs --no-color coordinator worker1 worker2 gateway \
     | grep -E "terminated by signal|was terminated by exception|PANIC|panicked"; then
  echo "FAIL: a process of the compose cluster crashed during the test" >&2; status=1
fi
[ $status = 0 ] || "${compose[@]}" logs --no-color --tail 20 >&2
exit $status
