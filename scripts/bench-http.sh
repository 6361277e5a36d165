#!/usr/bin/env bash
# The HTTP gateway under load against the same calls over SQL (the bench's
# `http` subcommand), on a cluster of its own ("benchhttp", port 54337)
# and a gateway of its own (127.0.0.1:18182, 64 pooled connections); both
# are stopped on exit. Arguments go to the bench, e.g.
#
#   scripts/bench-http.sh --duration 5s --connections 32
#   scripts/bench-http.sh --workloads counter,cloudforum,retwis
#
# The bench makes an API key for each application it loads (and revokes
# them at the end). The extension must be installed (make install) and the
# lambdas built.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cluster=$repo/scripts/cluster.sh
name=benchhttp
export LAMBDASTORE_PORT=54337
listen=127.0.0.1:18182
pool=64

# The bench's --connections, to size max_connections.
connections=64
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --connections=*) connections=${args[i]#*=} ;;
    --connections) connections=${args[i + 1]:-64} ;;
  esac
done

# Build first, so that neither the cluster nor the gateway idles meanwhile.
[ -f target/lambdas/counter.wasm ] || make lambdas
cargo build --release -p lambdastore-gateway -p lambdastore-bench

gateway_pid=
cleanup() {
  if [ -n "$gateway_pid" ] && kill -0 "$gateway_pid" 2>/dev/null; then
    kill -TERM "$gateway_pid"
    for _ in $(seq 1 100); do kill -0 "$gateway_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$gateway_pid" 2>/dev/null && { echo "gateway did not stop on SIGTERM; killing it" >&2; kill -KILL "$gateway_pid"; }
    wait "$gateway_pid" 2>/dev/null || true
  fi
  "$cluster" stop "$name"
}
trap cleanup EXIT

url=$("$cluster" fresh "$name")             # host=<run dir> port=54337 user=postgres dbname=postgres
db_url=${url/dbname=postgres/dbname=lambdastore_test}
run=$(sed -E 's/.*host=([^ ]+).*/\1/' <<<"$url")
gateway_log=$(dirname "$("$cluster" log "$name")")/gateway.log
sql() { psql "$db_url" -X -v ON_ERROR_STOP=1 -Atq "$@"; }

# The gateway's pool, the bench's direct connections, its admin connection,
# the job runners and some slack must fit.
needed=$((pool + connections + 20))
max=$(sql -c "SHOW max_connections")
if [ "$max" -lt "$needed" ]; then
  sql -c "ALTER SYSTEM SET max_connections = $((needed > 300 ? needed : 300))"
  "$cluster" stop "$name"
  "$cluster" start "$name" >/dev/null
fi
echo "cluster $name: $db_url (max_connections $(sql -c "SHOW max_connections"))"

sql <<'SQL'
CREATE EXTENSION IF NOT EXISTS lambdastore;
CREATE ROLE lambdastore_gateway LOGIN;
GRANT USAGE ON SCHEMA lambdastore_gateway TO lambdastore_gateway;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO lambdastore_gateway;
SQL

"${CARGO_TARGET_DIR:-target}/release/lambdastore-gateway" \
  --database-url "host=$run port=$LAMBDASTORE_PORT user=lambdastore_gateway dbname=lambdastore_test" \
  --listen "$listen" --pool-size "$pool" >"$gateway_log" 2>&1 &
gateway_pid=$!
ready=
for _ in $(seq 1 100); do
  kill -0 "$gateway_pid" 2>/dev/null || { echo "the gateway exited; see $gateway_log" >&2; cat "$gateway_log" >&2; exit 1; }
  if curl -fsS --max-time 2 "http://$listen/readyz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.2
done
[ -n "$ready" ] || { echo "the gateway was not ready after 20 s; see $gateway_log" >&2; exit 1; }
echo "gateway http://$listen (pid $gateway_pid, log $gateway_log)"

# Each row also reports the CPU time per request of the bench (its HTTP or
# SQL clients), the gateway and the server's processes (the postmaster's
# children: backends and workers).
postmaster=$(head -1 "$(sql -c 'SHOW data_directory')/postmaster.pid")
cargo run --quiet --release -p lambdastore-bench -- --url "$db_url" http --gateway "http://$listen" \
  --cpu-of "gateway=$gateway_pid" --cpu-of "server=$postmaster" "$@"
