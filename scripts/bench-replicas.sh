#!/usr/bin/env bash
# Light replicas (issue 47), the LambdaStore paper's experiment: one hot
# object on a Citus cluster (coordinator and two workers), a read-heavy,
# compute-heavy readonly method (`Bench.digest`: SHA-512 over its 1,000
# entries of 1 KiB), pgbench clients spread over the three nodes; the
# object with 0, 1 and 2 light replicas (the other worker, then the
# coordinator too). Then the replicas alone take the clients, to measure
# what serving them costs the owner (its CPU per call: the fetch and the
# commit, the paper's finalization). Rounds alternate; medians. Last, the
# rebalancer adds the replicas by itself (lambdastore.light_replica_threshold)
# under the same load, window by window. Its own
# cluster (citus-bench, ports 54360...), stopped on exit.
#
#   scripts/bench-replicas.sh          # ROUNDS=3 SECONDS_PER_RUN=8 CLIENTS=6
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
citus=$repo/scripts/citus.sh
cluster=$repo/scripts/cluster.sh
rounds=${ROUNDS:-3} seconds=${SECONDS_PER_RUN:-8} clients=${CLIENTS:-6}
[ -f target/lambdas/micro.wasm ] || make lambdas

trap '"$citus" stop citus-bench >/dev/null' EXIT
coord=$("$citus" fresh citus-bench)
sql() { psql "$coord" -X -v ON_ERROR_STOP=1 -Atq "$@"; }
sql -c "SELECT lambdastore.deploy('micro', pg_read_binary_file('$repo/target/lambdas/micro.wasm')) IS NOT NULL" >/dev/null
object=$(sql -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 1000}')")
owner=$(sql -c "SELECT n.nodename || ':' || n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                 WHERE p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', $object::bigint)")
declare -A url node
for n in coord w1 w2; do
  url[$n]=$("$citus" url citus-bench "$n")
  node[$n]=$(psql "${url[$n]}" -X -Atq -c "SELECT lambdastore.node()")
done
for n in w1 w2; do [ "${node[$n]}" = "$owner" ] && o=$n || r=$n; done
echo "object $object on $o ($owner); replicas: $r, then coord"

script=$(mktemp)
echo "SELECT lambda_invoke($object, 'digest');" >"$script"
. "$repo/scripts/bench-lib.sh"
cpu() { cpu_ticks "$("$cluster" dir "citus-bench-$1")/data"; }
# run NODE CLIENTS: the transactions pgbench completed there
run() { pgbench "${url[$1]}" -n -M prepared -c "$2" -j "$2" -T "$seconds" -f "$script" 2>/dev/null |
  awk '/actually processed/ {split($NF, a, "/"); print a[1]}'; }
# spread NODES...: the clients split over NODES at once; calls/s in all
spread() {
  local n i=0 total=0 each=$((clients / $#))
  for n in "$@"; do run "$n" "$each" >"$script.$n" & done; wait
  for n in "$@"; do total=$((total + $(cat "$script.$n"))); done
  echo $((total / seconds))
}
replicas() { # the object's replicas: none, w (the other worker), both
  sql -c "SELECT count(lambdastore.drop_light_replica($object, node)) FROM lambdastore.light_replicas" >/dev/null
  case $1 in
    w) sql -c "SELECT lambdastore.add_light_replica($object, '${node[$r]}')" >/dev/null ;;
    both) sql -c "SELECT lambdastore.add_light_replica($object, '${node[$r]}')" \
              -c "SELECT lambdastore.add_light_replica($object, '${node[coord]}')" >/dev/null ;;
  esac
}

for set in none w both; do replicas $set; spread coord $o $r >/dev/null; done # warm-up: modules, copies
: >"$script.out"
for round in $(seq "$rounds"); do
  for set in none w both; do
    replicas $set
    before=$(cpu $o)
    rate=$(spread coord $o $r)
    echo "$set $rate" >>"$script.out"
    echo "owner-$set $(( ($(cpu $o) - before) * 10000 / (rate * seconds) ))" >>"$script.out"
  done
  # What the replicas cost the owner: they alone take the clients.
  replicas both
  before=$(cpu $o)
  calls=$(spread coord $r)
  echo "finalize $(( ($(cpu $o) - before) * 10000 / (calls * seconds) ))" >>"$script.out"
  echo "round $round: $(tail -n 7 "$script.out" | tr '\n' ' ')"
done
# The rebalancer's own choice: no replica to start with, the background
# rebalancer every WINDOW seconds at the default threshold, the same load.
window=${WINDOW:-4}
replicas none
sql -c "ALTER SYSTEM SET lambdastore.rebalance_interval = '${window}s'" -c "SELECT pg_reload_conf()" >/dev/null
sql -c "SELECT count(*) FROM lambdastore.affinity(forget => true)" >/dev/null
for step in 1 2 3 4; do
  before=$(cpu $o)
  rate=$(spread coord $o $r)
  echo "rebalancer, ${seconds} s window $step: $rate calls/s, the owner's CPU per call" \
       "$(( ($(cpu $o) - before) * 10000 / (rate * seconds) )) µs, light replicas after it:" \
       "$(sql -c "SELECT coalesce(string_agg(node, ', ' ORDER BY added), 'none') FROM lambdastore.light_replicas")"
done
sql -c "ALTER SYSTEM RESET lambdastore.rebalance_interval" -c "SELECT pg_reload_conf()" >/dev/null
pick() { awk -v k="$1" '$1 == k {print $2}' "$script.out" | median; }
echo "Bench.digest (SHA-512 over 1,000 entries of 1 KiB), $clients clients over the 3 nodes, $rounds rounds of ${seconds} s, medians:"
echo "  no light replica:    $(pick none) calls/s; the owner's CPU per call $(pick owner-none) µs"
echo "  one (the worker):    $(pick w) calls/s; the owner's CPU per call $(pick owner-w) µs"
echo "  two (+ coordinator): $(pick both) calls/s; the owner's CPU per call $(pick owner-both) µs"
echo "  the owner's CPU per call served by a replica (fetch + commit): $(pick finalize) µs"
echo "  (three servers and pgbench share this machine's $(nproc) cores)"
rm -f "$script" "$script".*
