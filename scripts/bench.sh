#!/usr/bin/env bash
# The benchmark suite (`lambdastore-bench suite`) on a cluster of its own
# ("bench", port 54338, 2 GB shared_buffers so the read/write mix's data
# stays in memory), stopped on exit. Arguments go to the suite, e.g.
#
#   scripts/bench.sh --quick
#   scripts/bench.sh --workloads rw-mix --systems lambdastore,plpgsql --duration 20s
#
# The extension must be installed (make install) and the lambdas built.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cluster=$repo/scripts/cluster.sh
name=bench
export LAMBDASTORE_PORT=${LAMBDASTORE_BENCH_PORT:-54338}

# Build first, so that the cluster does not idle meanwhile.
[ -f target/lambdas/retwis.wasm ] || make lambdas
cargo build --release -p lambdastore-bench

trap '"$cluster" stop "$name"' EXIT
url=$("$cluster" fresh "$name")
db_url=${url/dbname=postgres/dbname=lambdastore_test}
sql() { psql "$db_url" -X -v ON_ERROR_STOP=1 -Atq "$@"; }
# The disaggregated baseline runs calls that may write as SERIALIZABLE: at
# the default 64, its predicate locks once filled PostgreSQL's table ("out
# of shared memory") in a full run.
sql -c "ALTER SYSTEM SET shared_buffers = '2GB'" -c "ALTER SYSTEM SET max_connections = 300" \
    -c "ALTER SYSTEM SET max_pred_locks_per_transaction = 256"
"$cluster" stop "$name"
"$cluster" start "$name" >/dev/null
echo "cluster $name: $db_url (shared_buffers $(sql -c 'SHOW shared_buffers'), max_pred_locks_per_transaction $(sql -c 'SHOW max_pred_locks_per_transaction'))"

"${CARGO_TARGET_DIR:-target}/release/lambdastore-bench" --url "$db_url" suite "$@"
