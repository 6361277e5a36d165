#!/usr/bin/env bash
# Readonly calls served by a hot standby (issue 47): one hot object, a
# read-heavy readonly method (`Bench.read`, 100 random 1 KiB entries of
# 1,000), pgbench's clients all on the primary, then half on the primary
# and half on a standby at once; rounds alternate, medians of transactions
# per second and of each server's CPU per call. Two clusters of its own
# ("bench-standby" on 54363 and its standby on 54364), stopped on exit.
#
#   scripts/bench-standby.sh            # ROUNDS=3 SECONDS_PER_RUN=10 CLIENTS=8
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cluster=$repo/scripts/cluster.sh
rounds=${ROUNDS:-3} seconds=${SECONDS_PER_RUN:-10} clients=${CLIENTS:-8}
[ -f target/lambdas/micro.wasm ] || make lambdas

export LAMBDASTORE_PORT=54363
trap '"$cluster" stop bench-standby-replica; "$cluster" stop bench-standby' EXIT
url=$("$cluster" fresh bench-standby)
primary=${url/dbname=postgres/dbname=lambdastore_test}
sql() { psql "$primary" -X -v ON_ERROR_STOP=1 -Atq "$@"; }
sql -c "CREATE EXTENSION IF NOT EXISTS lambdastore" \
    -c "SELECT lambdastore.deploy('micro', pg_read_binary_file('$repo/target/lambdas/micro.wasm')) IS NOT NULL" >/dev/null
object=$(sql -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 1000}')")
url=$(LAMBDASTORE_PORT=54364 "$cluster" standby bench-standby-replica bench-standby)
standby=${url/dbname=postgres/dbname=lambdastore_test}
psql "$standby" -X -Atq -c "SELECT lambdastore.wait_for_replay('$(sql -c "SELECT pg_current_wal_lsn()")', '60 s')"

script=$(mktemp)
echo "SELECT lambda_invoke($object, 'read', '{\"k\": 100}');" >"$script"
. "$repo/scripts/bench-lib.sh"
cpu() { cpu_ticks "$("$cluster" dir "$1")/data"; }
# run URL CLIENTS: transactions done, from pgbench's report
run() { pgbench "$1" -n -M prepared -c "$2" -j "$2" -T "$seconds" -f "$script" 2>/dev/null |
  awk '/actually processed/ {split($NF, a, "/"); print a[1]}'; }

run "$primary" "$clients" >/dev/null # warm-up: modules compiled, pages cached
run "$standby" "$clients" >/dev/null
: >"$script.alone"; : >"$script.both"; : >"$script.cpu"
for round in $(seq "$rounds"); do
  p0=$(cpu bench-standby)
  alone=$(run "$primary" "$clients")
  p1=$(cpu bench-standby)
  echo $((alone / seconds)) >>"$script.alone"
  echo "primary $(( (p1 - p0) * 10000 / alone ))" >>"$script.cpu"
  s0=$(cpu bench-standby-replica)
  half=$((clients / 2))
  run "$primary" "$half" >"$script.p" & run "$standby" "$((clients - half))" >"$script.s"; wait
  p2=$(cpu bench-standby); s1=$(cpu bench-standby-replica)
  echo $(( ($(cat "$script.p") + $(cat "$script.s")) / seconds )) >>"$script.both"
  echo "standby $(( (s1 - s0) * 10000 / $(cat "$script.s") ))" >>"$script.cpu"
  echo "round $round: primary alone $(tail -n 1 "$script.alone") calls/s; primary + standby $(tail -n 1 "$script.both") calls/s"
done
echo "Bench.read(100 of 1,000 entries), $clients clients, $rounds rounds of ${seconds} s, medians:"
echo "  primary alone:     $(median <"$script.alone") calls/s, $(awk '$1 == "primary" {print $2}' "$script.cpu" | median) µs of server CPU per call"
echo "  primary + standby: $(median <"$script.both") calls/s, the standby $(awk '$1 == "standby" {print $2}' "$script.cpu" | median) µs per call"
echo "  (both servers and pgbench share this machine's $(nproc) cores: with a standby on machines of its own, add its share)"
rm -f "$script" "$script".*
