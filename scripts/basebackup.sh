#!/usr/bin/env bash
# A physical backup of a server with deployed applications (issue 42): a
# primary with two applications and a job, `pg_basebackup -R -X stream`
# of it, the copy started as a hot standby, then promoted, and called.
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
cached=$(find "$primary_dir/data/lambdastore/cache" -name '*.cwasm' | wc -l)
[ "$cached" -ge 2 ] || { echo "FAIL: expected compiled modules in the primary's cache, found $cached" >&2; exit 1; }

rm -rf "$standby" && mkdir -p "$run"
[ "$(id -u)" = 0 ] && chown -R postgres:postgres "$standby"
as_pg "$bindir/pg_basebackup" -h "$primary_dir/run" -p "$primary_port" -U postgres -D "$standby/data" -R -X stream
check "pg_basebackup copied the module cache" "$cached" "$(find "$standby/data/lambdastore/cache" -name '*.cwasm' | wc -l)"
# The port is in Linux's ephemeral range: a client connection that was
# given it as its local port makes the bind fail until it closes (more
# likely with the Citus suites beside this one, scripts/test-lanes.sh).
# Such a start is tried again, a few times, as scripts/cluster.sh does.
for attempt in 1 2 3 4 5; do
  as_pg env -u RUST_BACKTRACE "$bindir/pg_ctl" -D "$standby/data" -l "$standby/postgresql.log" -w -t 60 \
    -o "-p $standby_port -k $run" start >/dev/null && break
  if [ "$attempt" = 5 ] || ! tail -n 5 "$standby/postgresql.log" | grep -q "could not create any TCP/IP sockets"; then
    echo "FAIL: the standby did not start; the end of its log:" >&2; tail -n 20 "$standby/postgresql.log" >&2; exit 1
  fi
  echo "port $standby_port is taken for now: starting the standby again" >&2
  sleep 1 # waiting out another process's connection, which nothing signals
done
check "the standby is in recovery" t "$(on_standby -c "SELECT pg_is_in_recovery()")"
# What the standby has replayed: wait for the last write of the primary.
lsn=$(primary -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 1 600); do
  [ "$(on_standby -c "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ] && break
  sleep 0.1 # polling replay progress, bounded at 60 s
done
check "the standby has the applications" "counter,micro" "$(on_standby -c "SELECT string_agg(name, ',' ORDER BY name) FROM lambdastore.applications")"

as_pg "$bindir/pg_ctl" -D "$standby/data" -w promote >/dev/null
check "promoted" f "$(on_standby -c "SELECT pg_is_in_recovery()")"
check "a call after promotion" 2 "$(on_standby -c "SELECT lambda_invoke($counter, 'increment')")"
check "the other application" '"v"' "$(on_standby -c "SELECT lambda_invoke($bench, 'get', '{\"key\": \"k\"}')")"
job=$(on_standby -c "SELECT lambdastore.submit($counter, 'increment')")
check "a job after promotion" done "$(on_standby -c "SELECT state FROM lambdastore.wait($job, '60 seconds')")"
check "the job's effect" 3 "$(on_standby -c "SELECT lambda_invoke($counter, 'get')")"
if grep -E "terminated by signal|PANIC" "$standby/postgresql.log"; then
  echo "FAIL: a process of the standby crashed" >&2; exit 1
fi
echo "base backup, standby and promotion: passed"
