#!/usr/bin/env bash
# A physical backup of a server with deployed applications (issue 42): a
# primary with two applications and a job, `pg_basebackup -R -X stream`
# of it, the copy started as a hot standby and called there (issue 47:
# readonly calls, read-your-writes, one snapshot per transaction), then
# promoted, and called.
# Part of `make test-e2e`; two clusters of its own on 127.0.0.1, stopped and
# removed at the end. Fails on the first thing that does not hold.
#
# Before the compiled-module cache had short file names, pg_basebackup
# stopped with "file name too long for tar format" on any server that had
# ever deployed an application (runtime/artifacts.rs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
bindir=$(pg_config --bindir)
primary_port=${LAMBDASTORE_BASEBACKUP_PORTS:-54337}
standby_port=$((primary_port + 1))
db=lambdastore_test

export LAMBDASTORE_PORT=$primary_port
"$cluster" fresh basebackup >/dev/null
primary_dir=$("$cluster" dir basebackup)
standby=$(dirname "$primary_dir")/basebackup-standby
run=$standby/run
if [ "$(id -u)" = 0 ]; then as_pg() { runuser -u postgres -- "$@"; }; else as_pg() { "$@"; }; fi
stop_all() {
  as_pg "$bindir/pg_ctl" -D "$standby/data" -m immediate -w stop >/dev/null 2>&1 || true
  "$cluster" stop basebackup || true
  rm -rf "$standby"
}
trap stop_all EXIT

primary() { "$cluster" psql basebackup -d "$db" -v ON_ERROR_STOP=1 -X -Atq "$@"; }
on_standby() { "$bindir/psql" -h "$run" -p "$standby_port" -U postgres -d "$db" -v ON_ERROR_STOP=1 -X -Atq "$@"; }
check() { # check WHAT EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then echo "FAIL: $1: expected '$2', got '$3'" >&2; exit 1; fi
  echo "ok: $1"
}

primary -c "CREATE EXTENSION IF NOT EXISTS lambdastore" >/dev/null
for app in counter micro; do
  primary -c "SELECT lambdastore.deploy('$app', pg_read_binary_file('$repo/target/lambdas/$app.wasm')) IS NOT NULL" >/dev/null
done
counter=$(primary -c "SELECT lambdastore.create_object('counter', 'Counter')")
bench=$(primary -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 0}')")
primary -c "SELECT lambda_invoke($counter, 'increment')" >/dev/null
primary -c "SELECT lambda_invoke($bench, 'put', '{\"key\": \"k\", \"value\": \"v\"}')" >/dev/null
# The gateway's least-privilege role (docs/gateway.md) and a key for the
# counter's application, for the gateway's --replica checks below.
primary -c "CREATE ROLE lambdastore_gateway LOGIN" \
  -c "GRANT USAGE ON SCHEMA lambdastore_gateway TO lambdastore_gateway" \
  -c "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO lambdastore_gateway" >/dev/null
key=$(primary -c "SELECT api_key FROM lambdastore.create_api_key('counter')")
cached=$(find "$primary_dir/data/lambdastore/cache" -name '*.cwasm' | wc -l)
[ "$cached" -ge 2 ] || { echo "FAIL: expected compiled modules in the primary's cache, found $cached" >&2; exit 1; }

LAMBDASTORE_PORT=$standby_port "$cluster" standby basebackup-standby basebackup >/dev/null
check "pg_basebackup copied the module cache" "$cached" "$(find "$standby/data/lambdastore/cache" -name '*.cwasm' | wc -l)"
check "the standby is in recovery" t "$(on_standby -c "SELECT pg_is_in_recovery()")"
# What the standby has replayed: wait for the last write of the primary.
on_standby -c "SELECT lambdastore.wait_for_replay('$(primary -c "SELECT pg_current_wal_lsn()")', '60 s')" >/dev/null
check "the standby has the applications" "counter,micro" "$(on_standby -c "SELECT string_agg(name, ',' ORDER BY name) FROM lambdastore.applications")"

# Calls on the hot standby (issue 47): readonly ones read what the primary
# committed, writing ones are refused, and no job runner runs there.
check "a readonly call on the standby" 1 "$(on_standby -c "SELECT lambda_invoke($counter, 'get')")"
check "the other application on the standby" '"v"' \
  "$(on_standby -c "SELECT lambda_invoke($bench, 'get', '{\"key\": \"k\"}')")"
sqlstate_on_standby() { "$bindir/psql" -h "$run" -p "$standby_port" -U postgres -d "$db" -X -Atq \
  -v VERBOSITY=sqlstate "$@" 2>&1 >/dev/null | sed 's/^ERROR: *//'; }
check "a writing call on the standby is refused" 25006 \
  "$(sqlstate_on_standby -c "SELECT lambda_invoke($counter, 'increment')")"
check "no job runner on the standby" 0 \
  "$(on_standby -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'lambdastore job runner'")"
check "a readonly call under REPEATABLE READ on the standby" 1 \
  "$(on_standby -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT lambda_invoke($counter, 'get')" -c "COMMIT")"

# Read-your-writes. Replay paused, so that the standby lags for certain: a
# write's LSN, read on the primary in the writer's session; a read without
# it sees the old value; waiting for it times out with 40001, and waits
# until replay resumes (from another session, half a second later).
# (Once the pause is requested, replay applies no further record.)
on_standby -c "SELECT pg_wal_replay_pause()" >/dev/null
lsn=$(primary -c "SELECT lambda_invoke($counter, 'increment')" -c "SELECT lambdastore.last_commit_lsn()" | tail -n 1)
check "a read without the write's LSN may be stale" 1 "$(on_standby -c "SELECT lambda_invoke($counter, 'get')")"
check "waiting for the LSN is bounded: 40001" 40001 \
  "$(sqlstate_on_standby -c "SELECT lambdastore.wait_for_replay('$lsn', '100 ms')")"
(sleep 0.5; on_standby -c "SELECT pg_wal_replay_resume()" >/dev/null) & # the lag ends while the read waits
check "a read after waiting for the write's LSN sees it" 2 \
  "$(on_standby -c "SELECT lambdastore.wait_for_replay('$lsn', '30 s')" -c "SELECT lambda_invoke($counter, 'get')" | tail -n 1)"
wait

# One snapshot per transaction: a second call in the transaction reads what
# the first did, though the standby replays a write in between (which a
# plain SELECT in the transaction sees).
in_transaction=$(on_standby <<SQL
BEGIN;
SELECT lambda_invoke($counter, 'get');
\\! $bindir/psql -h "$primary_dir/run" -p $primary_port -U postgres -d $db -X -Atq -c "SELECT lambda_invoke($counter, 'increment')" -c "SELECT lambdastore.last_commit_lsn()" | tail -n 1 > "$standby/lsn"
\\set lsn \`cat "$standby/lsn"\`
SELECT lambdastore.wait_for_replay(:'lsn', '30 s');
SELECT convert_from(value, 'UTF8') FROM lambdastore.entries WHERE object_id = $counter;
SELECT lambda_invoke($counter, 'get');
COMMIT;
SQL
)
check "calls in one transaction on the standby read one snapshot" "2,3,2" "$(echo $in_transaction | tr ' ' ',')"
check "a later transaction on the standby reads the new state" 3 "$(on_standby -c "SELECT lambda_invoke($counter, 'get')")"

# The gateway with the standby as a --replica: readonly calls go there,
# writing ones to the primary, whose answer carries the commit's LSN; a read
# carrying it (lambdastore-min-lsn) is answered by the primary while the
# standby lags, and by the standby once it has replayed that far.
gateway=${CARGO_TARGET_DIR:-$repo/target}/debug/lambdastore-gateway
[ -x "$gateway" ] || cargo build -q -p lambdastore-gateway
http_port=$((primary_port + 2))
"$gateway" --listen "127.0.0.1:$http_port" --replica-wait 300ms \
  --database-url "host=$primary_dir/run port=$primary_port user=lambdastore_gateway dbname=$db" \
  --replica "host=$run port=$standby_port user=lambdastore_gateway dbname=$db" >"$standby/gateway.log" 2>&1 &
gateway_pid=$!
trap 'kill $gateway_pid 2>/dev/null || true; stop_all' EXIT
for _ in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/readyz")" = 200 ] && break
  sleep 0.1 # polling the gateway's start, bounded at 30 s
done
# call METHOD [HEADER]: "<node> <commit lsn or -> <result>"
call() {
  curl -sS --fail-with-body -D "$standby/headers" -o "$standby/body" -X POST -H "Authorization: Bearer $key" \
    ${2:+-H "$2"} "http://127.0.0.1:$http_port/v1/objects/$counter/methods/$1" >/dev/null
  node=$(tr -d '\r' <"$standby/headers" | awk -F': ' 'tolower($1) == "x-lambdastore-node" {print $2}')
  lsn=$(tr -d '\r' <"$standby/headers" | awk -F': ' 'tolower($1) == "lambdastore-commit-lsn" {print $2}')
  echo "$node ${lsn:--} $(jq -c .result "$standby/body")"
}
check "gateway: a readonly call on the standby" "replica-1 - 3" "$(call get)"
answer=$(call increment)
check "gateway: a writing call on the primary, with its LSN" "local 4" "$(echo "$answer" | cut -d' ' -f1,3)"
[ "$(echo "$answer" | cut -d' ' -f2)" != - ] || { echo "FAIL: no lambdastore-commit-lsn on a write: $answer" >&2; exit 1; }
answer=$(call increment)
check "gateway: a known writer straight to the primary" "local 5" "$(echo "$answer" | cut -d' ' -f1,3)"
on_standby -c "SELECT lambdastore.wait_for_replay('$(echo "$answer" | cut -d' ' -f2)', '30 s')" >/dev/null
check "gateway: the method the standby refused is remembered" 1 \
  "$(curl -s "http://127.0.0.1:$http_port/metrics" | grep -c '^lambdastore_gateway_calls_total{node="replica-1"} 2$')"
on_standby -c "SELECT pg_wal_replay_pause()" >/dev/null
lsn=$(call increment | cut -d' ' -f2)
check "gateway: a read without the LSN, from the lagging standby" "replica-1 - 5" "$(call get)"
check "gateway: a read with the LSN, from the primary while the standby lags" "local - 6" \
  "$(call get "lambdastore-min-lsn: $lsn")"
on_standby -c "SELECT pg_wal_replay_resume()" >/dev/null
check "gateway: a read with the LSN, from the standby once replayed" "replica-1 - 6" \
  "$(call get "lambdastore-min-lsn: $lsn")"
check "gateway: a malformed LSN is 400" 400 "$(curl -s -o /dev/null -w '%{http_code}' -X POST \
  -H "Authorization: Bearer $key" -H 'lambdastore-min-lsn: 0/xyz' "http://127.0.0.1:$http_port/v1/objects/$counter/methods/get")"
kill "$gateway_pid"

as_pg "$bindir/pg_ctl" -D "$standby/data" -w promote >/dev/null
check "promoted" f "$(on_standby -c "SELECT pg_is_in_recovery()")"
check "a call after promotion" 7 "$(on_standby -c "SELECT lambda_invoke($counter, 'increment')")"
check "the other application" '"v"' "$(on_standby -c "SELECT lambda_invoke($bench, 'get', '{\"key\": \"k\"}')")"
job=$(on_standby -c "SELECT lambdastore.submit($counter, 'increment')")
check "a job after promotion" done "$(on_standby -c "SELECT state FROM lambdastore.wait($job, '60 seconds')")"
check "the job's effect" 8 "$(on_standby -c "SELECT lambda_invoke($counter, 'get')")"
if grep -E "terminated by signal|PANIC" "$standby/postgresql.log"; then
  echo "FAIL: a process of the standby crashed" >&2; exit 1
fi
echo "base backup, standby and promotion: passed"
