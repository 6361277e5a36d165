#!/usr/bin/env bash
# Host memory and time a hostile lambda can make a backend spend, with each
# protection lifted (its limit at the maximum) and with the defaults, side
# by side on a cluster of its own. Each case runs in a new connection; the
# backend's peak resident memory (VmHWM) is read from /proc after the call.
#
#   bench/host-memory.sh            # needs `make lambdas install` first
#
# Cases (issue 23, finding 4): 5,000 overwrites of one 1 MB value (the
# write buffer and its undo journal); a readonly scan of 23 MB of
# compressible values; 1,000,000 one-byte entries applied under a 1 s
# timeout (the apply phase's deadline checks; no setting lifts those).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
export LAMBDASTORE_PORT=${LAMBDASTORE_PORT:-54338}
"$cluster" fresh hostmem >/dev/null
trap '"$cluster" stop hostmem' EXIT
sql() { "$cluster" psql hostmem -d lambdastore_test -X -v ON_ERROR_STOP=1 -Atq "$@"; }

sql -c "CREATE EXTENSION lambdastore"
LAMBDASTORE_WASM=$repo/target/lambdas/micro.wasm sql >/dev/null <<'SQL'
\set wasm `base64 -w0 "$LAMBDASTORE_WASM"`
SELECT lambdastore.deploy('micro', decode(:'wasm', 'base64'));
SQL
# 23 entries of 1 MB of 'x' (TOAST compresses each to a few kB).
scan_object=$(sql -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 0}')")
sql -c "SET lambdastore.timeout = '60s'; SELECT lambda_invoke($scan_object, 'put_many', '{\"count\": 23, \"bytes\": 1000000}')" >/dev/null

# case NAME SETTINGS CALL: prints the outcome, the wall time and the peak RSS.
case_() {
  local name=$1 settings=$2 call=$3 object
  object=$(sql -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 0}')")
  [[ $call == *SCAN* ]] && object=$scan_object
  call=${call//SCAN/}
  sql <<SQL
$settings
\\set VERBOSITY terse
SELECT clock_timestamp() AS t0 \\gset
DO \$\$ BEGIN PERFORM lambda_invoke($object, $call); RAISE NOTICE 'ok';
       EXCEPTION WHEN OTHERS OR query_canceled THEN RAISE NOTICE '%', SQLSTATE; END \$\$;
SELECT format('%-36s %8s ms   peak RSS %6s MB', '$name',
              round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) * 1000),
              substring(pg_read_file('/proc/self/status') FROM 'VmHWM:\\s+(\\d+)')::bigint / 1024);
SQL
}

echo "case                                 outcome / wall time / peak resident memory of the backend"
case_ "overwrite 5,000 x 1 MB, no limit" "SET lambdastore.timeout = '120s'; SET lambdastore.max_write_size = '1TB';" \
  "'overwrite', '{\"count\": 5000, \"bytes\": 1000000}'"
case_ "overwrite 5,000 x 1 MB, default" "SET lambdastore.timeout = '120s';" \
  "'overwrite', '{\"count\": 5000, \"bytes\": 1000000}'"
case_ "scan 23 x 1 MB, no limit" "SET lambdastore.timeout = '120s'; SET lambdastore.max_scan_size = '1GB';" \
  "SCAN'scan_count'"
case_ "scan 23 x 1 MB, default" "SET lambdastore.timeout = '120s';" "SCAN'scan_count'"
case_ "put 1,000,000 x 1 B, no size limit" "SET lambdastore.timeout = '1s'; SET lambdastore.max_write_size = '1TB';" \
  "'put_many', '{\"count\": 1000000, \"bytes\": 1}'"
case_ "put 1,000,000 x 1 B, default" "SET lambdastore.timeout = '1s';" \
  "'put_many', '{\"count\": 1000000, \"bytes\": 1}'"
