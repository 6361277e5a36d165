#!/usr/bin/env bash
# `make test-compose`: docker-compose.yml brought up for real. Builds the
# images from this checkout (scripts/docker.sh), starts the cluster as a
# compose project of its own ("lambdastore-compose-test", on ports 54380–54382
# and 8091, so that a `docker compose up` of yours is left alone), runs
# tests/tests/compose.rs against it (the forum through the gateway, calls on
# the owner nodes, a worker container killed and started again), checks the
# nodes' logs for crashes and removes everything, volumes included, whatever
# happened.
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
"$docker" build || exit 1

export LAMBDASTORE_COORDINATOR_PORT=54380 LAMBDASTORE_WORKER1_PORT=54381 LAMBDASTORE_WORKER2_PORT=54382 \
       LAMBDASTORE_GATEWAY_PORT=8091
compose=("$docker" compose -p lambdastore-compose-test -f "$repo/docker-compose.yml")
down() { "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1; }
down # a run that was itself killed leaves its project behind
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
  cargo test -p lambdastore-tests --test compose -- --test-threads=1 "$@"
status=$?

# A crash can hide behind a failing test. The killed worker's processes all
# died at once, which no log line reports.
if "${compose[@]}" logs --no-color coordinator worker1 worker2 gateway \
     | grep -E "terminated by signal|was terminated by exception|PANIC|panicked"; then
  echo "FAIL: a process of the compose cluster crashed during the test" >&2; status=1
fi
[ $status = 0 ] || "${compose[@]}" logs --no-color --tail 20 >&2
exit $status
