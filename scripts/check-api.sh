#!/usr/bin/env bash
# Checks the HTTP gateway against its own OpenAPI document: schemathesis
# (pinned, in a venv under target/) generates requests from /openapi.json
# and runs every check on the responses of a live gateway, in front of a
# fresh cluster of its own ("api", port 54336) with the counter app
# deployed and one Counter object created. Exits non-zero on any failure.
#
#   scripts/check-api.sh [extra schemathesis run arguments...]
#
# CHECK_API_PORT sets the gateway's port (default 18181); CHECK_API_SEED and
# CHECK_API_EXAMPLES the hypothesis seed and examples per operation.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cluster=$repo/scripts/cluster.sh

SCHEMATHESIS_VERSION=4.32.5
venv=$repo/target/check-api-venv
port=${CHECK_API_PORT:-18181}
seed=${CHECK_API_SEED:-20240611}
examples=${CHECK_API_EXAMPLES:-50}
base=http://127.0.0.1:$port
wasm=target/lambdas/counter.wasm
started=$SECONDS

# The pinned schemathesis, installed once (reinstalled if the pin changes).
if [ ! -x "$venv/bin/schemathesis" ] || ! "$venv/bin/schemathesis" --version | grep -qF "version $SCHEMATHESIS_VERSION"; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

[ -f "$wasm" ] || make lambdas
cargo build --release -p lambdastore-gateway

if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "check-api: port $port is already in use (set CHECK_API_PORT)" >&2; exit 1
fi

# A fresh cluster; stopped, with the gateway, however the script ends.
gateway_pid=
cleanup() {
  if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
    kill -TERM "$gateway_pid"
    wait "$gateway_pid" || true
  fi
  LAMBDASTORE_PORT=54336 "$cluster" stop api || true
}
trap cleanup EXIT
url=$(LAMBDASTORE_PORT=54336 "$cluster" fresh api)
run=$(sed -n 's/.*host=\([^ ]*\).*/\1/p' <<<"$url")
sql() { psql -h "$run" -p 54336 -U postgres -d lambdastore_test -X -Atq -v ON_ERROR_STOP=1 "$@"; }

# The extension, the gateway's least-privilege role (as in docs/gateway.md), and
# an API key for the counter app.
sql <<'SQL'
CREATE EXTENSION lambdastore;
CREATE ROLE lambdastore_gateway LOGIN;
GRANT USAGE ON SCHEMA lambdastore_gateway TO lambdastore_gateway;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO lambdastore_gateway;
SQL
key=$(sql -c "SELECT api_key FROM lambdastore.create_api_key('counter')")

# The gateway, logging to a file; wait (bounded) until it is ready.
log=$repo/target/check-api-gateway.log
"${CARGO_TARGET_DIR:-target}/release/lambdastore-gateway" \
  --database-url "host=$run port=54336 user=lambdastore_gateway dbname=lambdastore_test" \
  --listen "127.0.0.1:$port" >"$log" 2>&1 &
gateway_pid=$!
for _ in $(seq 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz")" = 200 ] && break
  kill -0 "$gateway_pid" 2>/dev/null || { echo "check-api: the gateway exited; see $log" >&2; exit 1; }
  sleep 0.1
done
curl -sf -o /dev/null "$base/readyz" || { echo "check-api: the gateway is not ready; see $log" >&2; exit 1; }

# The counter app and one object, so that some generated requests reach
# real code and a real object (ids start at 1).
auth="Authorization: Bearer $key"
curl -sSf -o /dev/null -X PUT -H "$auth" -H 'content-type: application/wasm' \
  --data-binary "@$wasm" "$base/v1/apps/counter/module"
curl -sSf -o /dev/null -X POST -H "$auth" -H 'content-type: application/json' \
  --data '{"initial": 1}' "$base/v1/apps/counter/types/Counter/objects"

# Every check, a fixed seed and a bounded number of examples per operation,
# so that runs are repeatable and short.
echo "check-api: schemathesis $SCHEMATHESIS_VERSION against $base/openapi.json (seed $seed, $examples examples)"
# No crash cache: by default schemathesis keeps the failures it found under
# ./.schemathesis and replays them first, so a run would depend on the last.
config=$repo/target/check-api/schemathesis.toml
mkdir -p "$(dirname "$config")"
printf '[cache]\nenabled = false\n' >"$config"
st_started=$SECONDS
status=0
"$venv/bin/schemathesis" --config-file "$config" run "$base/openapi.json" \
  --header "$auth" \
  --checks all \
  --seed "$seed" \
  --max-examples "$examples" \
  --generation-database none \
  --workers 1 \
  --no-color \
  "$@" || status=$?
echo "check-api: schemathesis took $((SECONDS - st_started))s, the whole check $((SECONDS - started))s (exit $status; gateway log: $log)"
exit $status
