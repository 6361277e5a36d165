#!/usr/bin/env bash
# `make bench-citus`: one node against the local Citus cluster, side by
# side in one run (the machine is noisy). Five parts (PARTS picks them):
#
# table: pgbench, 8 clients, on 1,000 counters, alternating single node and
# cluster ROUNDS times; medians (WORKLOADS picks rows).
#
#   read-only   SELECT lambda_invoke(id, 'get')                 one call
#   write       SELECT lambda_invoke(id, 'increment')           one call
#   two-object  BEGIN; increment a; increment b; COMMIT         a, b on one node
#   two-node    the same with a and b on two nodes              (two-phase commit)
#   nested-one-node   SELECT lambda_invoke(a, 'transfer', b)    bank: a's lambda calls b.deposit,
#   nested-two-node   the same with a and b on two nodes        a nested call to another node
#   cloudforum  90% Thread.get_thread, 10% Account.add_comment (a nested call to the thread,
#               on another node half the time): 1,000 threads by 200 accounts in 10 communities
#   retwis      90% User.get_timeline (50 newest), 10% User.create_post (delivered to its 20
#               followers, on every node): 1,000 users, one post each to start with
#
# gateway: on the cluster only, the bench's `http` subcommand (counter get
# and increment, the cloudforum and retwis mixes above on data of their
# own; 8 connections) against two gateways, alternating ROUNDS times:
# `--placement single` (every call to the coordinator, which forwards it)
# and `--placement citus` (each call straight to the worker holding its
# object); each run also makes the same calls over SQL to the coordinator,
# for reference. Medians (GATEWAY_WORKLOADS picks rows).
#
# migration: on the cluster, 30 s of pgbench (1 client reading and
# incrementing one counter, 7 clients the others); at 10 s
# lambdastore.migrate_object moves that counter to the other worker, at
# 20 s back. Throughput per 250 ms, drawn to bench/results/citus-migration.svg
# and .png (the bench's `timeline` subcommand), with a table of the dips;
# 40001s are retried, any other error fails the run.
#
# contended: the issue-41 workload. 3 hot bank accounts ("hotels") and 100
# others ("customers"); 16 clients, each CONTENDED_OPS operations: 40% a
# customer's `transfer` of 1 to a hot account (a booking), 40% a hot
# account's `transfer` of 1 back (a cancellation), 20% `total_with` audits
# of a hot account and a customer. On the cluster the hot accounts are on
# one worker and the customers on the other, so every workflow crosses
# nodes, and the clients are spread over the coordinator and both workers;
# on the single node all 16 are on it. pgbench retries 40001 and 40P01 up
# to 100 tries. Each runs with the lambdastore settings of each label in
# CONTENDED_SETTINGS ("default": none; else name=value[,name=value]), by
# default commit_wait=0 (a reader fails at once on a set being committed)
# and the defaults, alternating ROUNDS times: retries per committed
# operation, operations that gave up after 100 tries, p50 and p99 latency;
# medians.
#
# delegated: what a Citus user writes instead (issue 44), on the cluster
# only: the same 1,000 counters as rows of a plain table `kv` distributed
# colocated with lambdastore.objects (a row's key is its counter's object
# id), read and incremented by PL/pgSQL functions kv_get(k) and kv_incr(k)
# that create_distributed_function delegates by k to the node holding the
# row. pgbench, 8 clients, alternating ROUNDS times: through the
# coordinator (router SELECT, delegated functions, lambda_invoke) and on
# the worker holding the rows/objects picked (each worker's share of the
# counters, in a local table there). Medians, and each lambda row's ratio
# to the delegated function in the same place (the median of the rounds'
# own ratios, and those). Then the bank transfer a → b, a and b on one
# node or on two, through the coordinator, three ways: kv_transfer(a, b) in
# PL/pgSQL delegated by a (two UPDATEs), the two UPDATEs in BEGIN ...
# COMMIT, and the nested lambda call of the table part; each way's
# two-node time over its one-node time, as the lambda rows' ratios.
#
# The single node is a project cluster ("bench-single", port 54339); the
# cluster is citus-bench (a coordinator and two workers, ports 54360-54362),
# started fresh; the gateways listen on 127.0.0.1:18190 and 18191. In the
# table, every call goes through the coordinator, which forwards it to the
# worker holding its object. Everything started here stops on exit. The
# cluster's ports are docker-compose.yml's defaults too: not beside `make
# test-compose`.
#
#   PARTS="table delegated gateway migration contended"  ROUNDS=3  CONTENDED_OPS=300  CONTENDED_SETTINGS="commit_wait=0 default"  SECONDS_PER_RUN=10  WORKLOADS="read-only ..."
#   GATEWAY_WORKLOADS=counter,cloudforum,retwis  GATEWAY_OUT=FILE (keeps the bench's own tables)
#   MIGRATION_SECONDS=30  MIGRATION_PLOT=bench/results/citus-migration (without extension)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
citus=$repo/scripts/citus.sh
bin=${CARGO_TARGET_DIR:-$repo/target}/release
lambdas=$repo/target/lambdas
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
PARTS=${PARTS:-table delegated gateway migration contended}
MIGRATION_SECONDS=${MIGRATION_SECONDS:-30}
COUNTERS=1000
for part in $PARTS; do
  case $part in table|delegated|gateway|migration|contended) ;; *) echo "PARTS: table, delegated, gateway, migration or contended, not $part" >&2; exit 2 ;; esac
done
[ -f "$lambdas/retwis.wasm" ] || { echo "no $lambdas/retwis.wasm: make lambdas first" >&2; exit 1; }
# Built first, so that no cluster idles meanwhile.
case $PARTS in *gateway*|*migration*) cargo build --release -q -p lambdastore-gateway -p lambdastore-bench ;; esac

work=$(mktemp -d)
pids=() # gateways and pgbench runs in the background
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    # SIGTERM lets a gateway finish its requests; bounded, then SIGKILL.
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
  LAMBDASTORE_PORT=54339 "$cluster" stop bench-single
  "$citus" stop citus-bench
}
trap cleanup EXIT

case $PARTS in
  *table*|*contended*)
    single=$(LAMBDASTORE_PORT=54339 "$cluster" fresh bench-single)
    single=${single/dbname=postgres/dbname=lambdastore_test}
    psql "$single" -X -q -c "CREATE EXTENSION IF NOT EXISTS lambdastore"
    ;;
esac
coordinator=$("$citus" fresh citus-bench)
coordinator_port=$("$cluster" port citus-bench-coord)

# The counters, and a local table of their ids (k = 1..1000), so that the
# scripts pick one without knowing how ids look on a cluster. `pair` holds
# pairs of counters on one node (same = true) or on two (same = false).
setup() {
  LAMBDASTORE_COUNTER=$lambdas/counter.wasm LAMBDASTORE_BANK=$lambdas/bank.wasm \
    LAMBDASTORE_FORUM=$lambdas/forum.wasm LAMBDASTORE_RETWIS=$lambdas/retwis.wasm \
    psql "$1" -X -q -v ON_ERROR_STOP=1 <<'SQL'
\set counter `base64 -w0 "$LAMBDASTORE_COUNTER"`
\set bank `base64 -w0 "$LAMBDASTORE_BANK"`
\set forum `base64 -w0 "$LAMBDASTORE_FORUM"`
\set retwis `base64 -w0 "$LAMBDASTORE_RETWIS"`
SELECT lambdastore.deploy('counter', decode(:'counter', 'base64')) \gset
SELECT lambdastore.deploy('bank', decode(:'bank', 'base64')) \gset
SELECT lambdastore.deploy('forum', decode(:'forum', 'base64')) \gset
SELECT lambdastore.deploy('retwis', decode(:'retwis', 'base64')) \gset
CREATE TABLE ids (k int PRIMARY KEY, id bigint NOT NULL);
INSERT INTO ids SELECT k, lambdastore.create_object('counter', 'Counter', '{}') FROM generate_series(1, 1000) k;
CREATE TABLE accounts (k int PRIMARY KEY, id bigint NOT NULL);
INSERT INTO accounts
SELECT k, lambdastore.create_object('bank', 'Account', '{"owner": "bench", "initial": 1000000000}')
  FROM generate_series(1, 1000) k;
CREATE TABLE pair (k int, same boolean, a bigint, b bigint, PRIMARY KEY (same, k));
CREATE TABLE account_pair (LIKE pair INCLUDING ALL);
-- CloudForum: each thread made by its author's create_thread, as users
-- make them (on a cluster, on the author's node, indexed by a community
-- that may be on another).
CREATE TABLE forum_accounts (k int PRIMARY KEY, id bigint NOT NULL);
INSERT INTO forum_accounts
SELECT k, lambdastore.create_object('forum', 'Account', jsonb_build_object('name', 'user ' || k))
  FROM generate_series(1, 200) k;
CREATE TABLE forum_communities (k int PRIMARY KEY, id bigint NOT NULL);
INSERT INTO forum_communities
SELECT k, lambdastore.create_object('forum', 'Community', jsonb_build_object('name', 'community ' || k))
  FROM generate_series(1, 10) k;
CREATE TABLE forum_threads (k int PRIMARY KEY, id bigint NOT NULL);
INSERT INTO forum_threads
SELECT g, lambda_invoke((SELECT id FROM forum_accounts WHERE k = 1 + g % 200), 'create_thread',
                        jsonb_build_object('community', (SELECT id FROM forum_communities WHERE k = 1 + g % 10),
                                           'title', 'thread ' || g, 'text', repeat('x', 200)))::bigint
  FROM generate_series(1, 1000) g;
-- Retwis, as the suite sets it up (bench/src/suite/workloads.rs): each
-- user followed by 20 others (here users k + 47j around the ring, so
-- spread over the nodes by their ids' hash), then one post each, so that
-- timelines are not empty. A transaction per user: on a cluster, a
-- prepared transaction may carry 1,024 entry locks, and 1,000 posts to 21
-- timelines each would take ten times that.
CREATE TABLE retwis_users (k int PRIMARY KEY, id bigint NOT NULL);
INSERT INTO retwis_users
SELECT k, lambdastore.create_object('retwis', 'User', jsonb_build_object('name', 'user ' || k))
  FROM generate_series(1, 1000) k;
\o /dev/null
SELECT format('SELECT lambda_invoke(%s, %L, %L)', u.id, 'add_followers', jsonb_build_object('followers', f.ids))
  FROM retwis_users u,
       LATERAL (SELECT jsonb_agg(f.id) AS ids FROM generate_series(1, 20) j
                  JOIN retwis_users f ON f.k = 1 + (u.k - 1 + 47 * j) % 1000) f \gexec
SELECT format('SELECT lambda_invoke(%s, %L, %L)', id, 'create_post', jsonb_build_object('text', 'hello from user ' || k))
  FROM retwis_users \gexec
\o
SQL
}

# Pairs: on one node by the shard's node; on the single node, any two.
pairs() {
  for objects in ids:pair accounts:account_pair; do
    psql "$single" -X -q -c "INSERT INTO ${objects#*:} SELECT k, s, k, 1001 - k FROM generate_series(1, 500) k, (VALUES (true), (false)) v(s);
                             UPDATE ${objects#*:} p SET a = (SELECT id FROM ${objects%:*} i WHERE i.k = p.a),
                                                        b = (SELECT id FROM ${objects%:*} i WHERE i.k = p.b)"
  done
  cluster_pairs
}

# The cluster's pairs, once.
cluster_pairs() {
  [ "$(psql "$coordinator" -X -Atq -c "SELECT count(*) FROM pair")" = 0 ] || return 0
  for objects in ids:pair accounts:account_pair; do
    psql "$coordinator" -X -q <<SQL
CREATE TEMP TABLE placed AS
SELECT i.id, p.groupid FROM ${objects%:*} i
  JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', i.id);
INSERT INTO ${objects#*:}
SELECT row_number() OVER (), x.groupid = y.groupid, x.id, y.id
  FROM placed x JOIN placed y ON x.id < y.id AND x.groupid = y.groupid
 WHERE (x.id + y.id) % 97 = 0
 LIMIT 500;
INSERT INTO ${objects#*:}
SELECT row_number() OVER (), false, x.id, y.id
  FROM placed x JOIN placed y ON x.id < y.id AND x.groupid <> y.groupid
 WHERE (x.id + y.id) % 97 = 0
 LIMIT 500;
SQL
  done
}

# The scripts pick counter k of first..last (-D), all of them by default (run).
cat >"$work/read-only.sql" <<'SQL'
\set k random(:first, :last)
SELECT lambda_invoke((SELECT id FROM ids WHERE k = :k), 'get');
SQL
cat >"$work/write.sql" <<'SQL'
\set k random(:first, :last)
SELECT lambda_invoke((SELECT id FROM ids WHERE k = :k), 'increment');
SQL
for kind in two-object:true two-node:false; do
  cat >"$work/${kind%%:*}.sql" <<SQL
\\set k random(1, 400)
SELECT a, b FROM pair WHERE same = ${kind##*:} AND k = :k \\gset
BEGIN;
SELECT lambda_invoke(:a, 'increment');
SELECT lambda_invoke(:b, 'increment');
COMMIT;
SQL
done
for kind in nested-one-node:true nested-two-node:false; do
  cat >"$work/${kind%%:*}.sql" <<SQL
\\set k random(1, 400)
SELECT a, b FROM account_pair WHERE same = ${kind##*:} AND k = :k \\gset
SELECT lambda_invoke(:a, 'transfer', jsonb_build_object('to', :b, 'amount', 1));
SQL
done

cat >"$work/cloudforum.sql" <<'SQL'
\set t random(1, 1000)
\if random(1, 100) <= 90
SELECT lambda_invoke((SELECT id FROM forum_threads WHERE k = :t), 'get_thread');
\else
\set a random(1, 200)
SELECT lambda_invoke((SELECT id FROM forum_accounts WHERE k = :a), 'add_comment',
       jsonb_build_object('thread', (SELECT id FROM forum_threads WHERE k = :t),
                          'text', 'A comment posted by pgbench, about sixty bytes.'));
\endif
SQL

# bench/pgbench/retwis-lambdastore.sql's mix, with users picked by k.
cat >"$work/retwis.sql" <<'SQL'
\set u random(1, 1000)
\if random(1, 100) <= 90
SELECT lambda_invoke((SELECT id FROM retwis_users WHERE k = :u), 'get_timeline', '{"limit": 50}');
\else
SELECT lambda_invoke((SELECT id FROM retwis_users WHERE k = :u), 'create_post', '{"text": "Just setting up my retwis: a benchmark post of about the length of a typical tweet, the same text every time."}');
\endif
SQL

# pgbench's tps and mean latency, from its summary; serialization failures
# (40001) are retried, as clients of a serializable system do.
run() {
  pgbench "$1" -n -c 8 -j 2 -T "$SECONDS_PER_RUN" --max-tries=1000 -D first=1 -D last=$COUNTERS -f "$work/$2.sql" 2>/dev/null \
    | awk '/^latency average/ {lat=$4} /^tps/ {tps=$3} END {printf "%.0f %.2f\n", tps, lat}'
}
. "$repo/scripts/bench-lib.sh"
# The median of column $2 of file $1.
median_of() { cut -d' ' -f"$2" "$1" | median; }
ratio() { awk "BEGIN {printf \"%.2f\", $1 / $2}"; }

table_part() {
  pairs
  echo "| workload | single node tx/s | cluster tx/s | cluster / single | single ms | cluster ms |"
  echo "|---|---:|---:|---:|---:|---:|"
  for workload in ${WORKLOADS:-read-only write two-object two-node nested-one-node nested-two-node cloudforum retwis}; do
    : >"$work/single" && : >"$work/cluster"
    for _ in $(seq "$ROUNDS"); do
      run "$single" "$workload" >>"$work/single"
      run "$coordinator" "$workload" >>"$work/cluster"
    done
    s_tps=$(median_of "$work/single" 1); c_tps=$(median_of "$work/cluster" 1)
    echo "| $workload | $s_tps | $c_tps | $(ratio "$c_tps" "$s_tps") | $(median_of "$work/single" 2) | $(median_of "$work/cluster" 2) |"
  done
}

delegated_part() {
  psql "$coordinator" -X -q -o /dev/null -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE kv (k bigint PRIMARY KEY, v bigint NOT NULL);
SELECT create_distributed_table('kv', 'k', colocate_with := 'lambdastore.objects');
INSERT INTO kv SELECT id, 0 FROM ids;
CREATE FUNCTION kv_get(key bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT v FROM kv WHERE k = key);
END $$;
CREATE FUNCTION kv_incr(key bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    result bigint;
BEGIN
    UPDATE kv SET v = v + 1 WHERE k = key RETURNING v INTO result;
    RETURN result;
END $$;
CREATE FUNCTION kv_transfer(a bigint, b bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE kv SET v = v - 1 WHERE k = a;
    UPDATE kv SET v = v + 1 WHERE k = b;
END $$;
SELECT create_distributed_function('kv_get(bigint)', 'key', colocate_with := 'kv');
SELECT create_distributed_function('kv_incr(bigint)', 'key', colocate_with := 'kv');
SELECT create_distributed_function('kv_transfer(bigint, bigint)', 'a', colocate_with := 'kv');
SQL
  cluster_pairs
  # Each worker's share of the counters, numbered 1..n there.
  local url owned n w
  owned="SELECT row_number() OVER (ORDER BY i.k), i.id FROM ids i
           JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', i.id)
           JOIN pg_dist_node n ON n.groupid = p.groupid WHERE n.nodeport = "
  for w in w1 w2; do
    url=$("$citus" url citus-bench $w)
    psql "$coordinator" -X -Atq -c "COPY ($owned$("$cluster" port citus-bench-$w)) TO STDOUT" \
      | psql "$url" -X -q -v ON_ERROR_STOP=1 -c "CREATE TABLE owned (k int PRIMARY KEY, id bigint NOT NULL)" -c "COPY owned FROM STDIN"
  done
  n=$(psql "$("$citus" url citus-bench w1)" -X -Atq -c "SELECT count(*) FROM owned")
  local statement
  for statement in "router:SELECT v FROM kv WHERE k = " "kv_get:SELECT kv_get(" "get:SELECT lambda_invoke(" \
                   "kv_incr:SELECT kv_incr(" "increment:SELECT lambda_invoke("; do
    # pgbench: the id looked up in a local table, then the statement.
    local name=${statement%%:*} text=${statement#*:} close=")"
    case $name in router) close="" ;; get) close=", 'get')" ;; increment) close=", 'increment')" ;; esac
    for table in ids owned; do
      # The id first (a constant argument is what Citus delegates by).
      printf '\\set k random(:first, :last)\nSELECT id FROM %s WHERE k = :k \\gset\n%s:id%s;\n' \
        "$table" "$text" "$close" >"$work/$name-$table.sql"
    done
  done
  # The transfers: kv's rows are the counters' (pair), the lambda's the
  # accounts' (account_pair), placed alike.
  local same way
  for same in one:true two:false; do
    for way in "kv_transfer:SELECT kv_transfer(:a, :b);" \
               "block:BEGIN; UPDATE kv SET v = v - 1 WHERE k = :a; UPDATE kv SET v = v + 1 WHERE k = :b; COMMIT;"; do
      printf '\\set k random(1, 400)\nSELECT a, b FROM pair WHERE same = %s AND k = :k \\gset\n%s\n' "${same#*:}" \
        "${way#*:}" >"$work/${way%%:*}-${same%%:*}.sql"
    done
    cp "$work/nested-${same%%:*}-node.sql" "$work/transfer-${same%%:*}.sql"
  done
  local w1
  w1=$("$citus" url citus-bench w1)
  : >"$work/delegated-rows"
  for _ in $(seq "$ROUNDS"); do
    for name in router kv_get get kv_incr increment; do
      echo "$name coordinator $(COUNTERS=1000 run "$coordinator" "$name-ids")" >>"$work/delegated-rows"
      [ "$name" = router ] && continue
      echo "$name worker $(COUNTERS=$n run "$w1" "$name-owned")" >>"$work/delegated-rows"
    done
    for name in kv_transfer block transfer; do
      for same in one two; do
        echo "$name-$same coordinator $(run "$coordinator" "$name-$same")" >>"$work/delegated-rows"
      done
    done
  done
  delegated_runs() { awk -v n="$1" -v w="$2" '$1 == n && $2 == w {print $3}' "$work/delegated-rows"; }
  delegated_median() { delegated_runs "$1" "$2" | median; }
  echo "| statement, 8 clients | through the coordinator tx/s | on the worker holding the row/object tx/s |"
  echo "|---|---:|---:|"
  echo "| router \`SELECT v FROM kv WHERE k = \$1\` | $(delegated_median router coordinator) | — |"
  local fn lambda c w
  for fn in kv_get:get kv_incr:increment; do
    lambda=${fn#*:} fn=${fn%%:*}
    echo "| delegated PL/pgSQL \`$fn(k)\` | $(delegated_median "$fn" coordinator) | $(delegated_median "$fn" worker) |"
    c=$(delegated_median "$lambda" coordinator) w=$(delegated_median "$lambda" worker)
    echo "| \`lambda_invoke(id, '$lambda')\` | $c, ×$(round_ratios <(delegated_runs "$lambda" coordinator) <(delegated_runs "$fn" coordinator) 2) | $w, ×$(round_ratios <(delegated_runs "$lambda" worker) <(delegated_runs "$fn" worker) 2) |"
  done
  echo
  echo "| transfer a → b through the coordinator, 8 clients | a, b on one node tx/s | on two nodes tx/s | two nodes ÷ one, in time |"
  echo "|---|---:|---:|---:|"
  local way label one two
  for way in "kv_transfer:delegated PL/pgSQL \`kv_transfer(a, b)\`" "block:\`BEGIN\`, two \`UPDATE\`s, \`COMMIT\`" \
             "transfer:\`lambda_invoke(a, 'transfer', b)\` (a nested call)"; do
    label=${way#*:} way=${way%%:*}
    one=$(delegated_median "$way-one" coordinator) two=$(delegated_median "$way-two" coordinator)
    echo "| $label | $one | $two | $(round_ratios <(delegated_runs "$way-one" coordinator) <(delegated_runs "$way-two" coordinator) 2) |"
  done
  echo "runs (statement, where, tx/s, ms):"
  cat "$work/delegated-rows"
}

# A gateway on 127.0.0.1:PORT with --placement PLACEMENT, as docs/gateway.md's
# least-privilege role; returns once /readyz answers.
start_gateway() {
  local log=$work/gateway-$2.log
  "$bin/lambdastore-gateway" --placement "$2" --listen "127.0.0.1:$1" --pool-size 16 \
    --database-url "host=127.0.0.1 port=$coordinator_port user=lambdastore_gateway dbname=lambdastore_bench" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "the gateway ($2) exited:" >&2; cat "$log" >&2; exit 1; }
    if curl -fsS --max-time 2 "http://127.0.0.1:$1/readyz" >/dev/null 2>&1; then return; fi
    sleep 0.2
  done
  echo "the gateway ($2) was not ready after 20 s:" >&2; cat "$log" >&2; exit 1
}

gateway_part() {
  # The gateway's role on every node (docker/init.sh's step, which also
  # makes a key for the forum); the http subcommand makes its own keys.
  LAMBDASTORE_COORDINATOR=127.0.0.1:$coordinator_port LAMBDASTORE_DATABASE=lambdastore_bench \
    LAMBDASTORE_STATE=$work "$repo/docker/init.sh" gateway >/dev/null
  start_gateway 18190 single
  start_gateway 18191 citus
  : >"$work/http"
  for _ in $(seq "$ROUNDS"); do
    for gateway in 18190:coordinator 18191:owner; do
      # Its table's rows: | get, HTTP gateway | 8 | 1234 | 0.61 ms | ...;
      # kept as "<via> TAB <row> TAB <requests/s> TAB <p50 ms>".
      "$bin/lambdastore-bench" --lambdas "$lambdas" --url "$coordinator" http --gateway "http://127.0.0.1:${gateway%%:*}" \
        --workloads "${GATEWAY_WORKLOADS:-counter,cloudforum,retwis}" \
        --connections 8 --duration "${SECONDS_PER_RUN}s" --warmup 2s \
        | tee -a "${GATEWAY_OUT:-/dev/null}" \
        | awk -F' *[|] *' -v OFS='\t' -v gw="gateway-${gateway#*:}" '$2 ~ /, (HTTP gateway|direct SQL)$/ {
            via = ($2 ~ /HTTP gateway$/) ? gw : "sql"; w = $2; sub(/, (HTTP gateway|direct SQL)$/, "", w)
            print via, w, $4, $5 + 0 }' >>"$work/http"
    done
  done
  echo "| calls (8 connections) | SQL to the coordinator req/s | gateway, all to the coordinator | gateway, direct to the owner | direct / coordinator (gateway) | p50 ms: SQL | gateway to coordinator | gateway direct |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  local workload via sql coord owner
  # The rows in the bench's order.
  while IFS= read -r workload; do
    for via in sql gateway-coordinator gateway-owner; do
      awk -F'\t' -v via="$via" -v w="$workload" '$1 == via && $2 == w {print $3, $4}' "$work/http" >"$work/$via"
    done
    sql=$(median_of "$work/sql" 1); coord=$(median_of "$work/gateway-coordinator" 1); owner=$(median_of "$work/gateway-owner" 1)
    echo "| $workload | $sql | $coord | $owner | $(ratio "$owner" "$coord") | $(median_of "$work/sql" 2) | $(median_of "$work/gateway-coordinator" 2) | $(median_of "$work/gateway-owner" 2) |"
  done < <(awk -F'\t' '!seen[$2]++ {print $2}' "$work/http")
}

# At AT seconds after $moves_from, lambdastore.migrate_object($hot, NODE):
# the timing is the experiment's schedule, not a wait for anything. Adds a
# --span LABEL=START,END for the timeline.
migrate_at() {
  sleep "$(awk -v at="$1" -v from="$moves_from" -v now="$(date +%s.%N)" 'BEGIN {d = from + at - now; print (d > 0 ? d : 0)}')"
  local started
  started=$(date +%s.%N)
  psql "$coordinator" -X -Atq -v ON_ERROR_STOP=1 -c "SELECT lambdastore.migrate_object($hot, '$2')" >/dev/null
  spans+=(--span "$3=$started,$(date +%s.%N)")
}

# A pgbench run in the background on counters FIRST..LAST with CLIENTS
# clients, half reads, half increments: LOG.<pid>* per transaction.
load() {
  pgbench "$coordinator" -n -c "$4" -j 1 -T "$MIGRATION_SECONDS" --max-tries=1000 -D first="$2" -D last="$3" \
    -l --log-prefix "$work/$1" -f "$work/read-only.sql@1" -f "$work/write.sql@1" >"$work/$1.out" 2>&1 &
  pids+=($!)
}

# w1, w2, ... of a worker's host:port (ports: the coordinator's plus N).
worker() { echo "w$((${1##*:} - coordinator_port))"; }

migration_part() {
  hot=$(psql "$coordinator" -X -Atq -c "SELECT id FROM ids WHERE k = 1")
  local home away increments_before
  home=$(psql "$coordinator" -X -Atq -c "SELECT nodename || ':' || nodeport FROM pg_dist_placement JOIN pg_dist_node USING (groupid)
                                          WHERE shardid = get_shard_id_for_distribution_column('lambdastore.objects', $hot::bigint)")
  away=$(psql "$coordinator" -X -Atq -c "SELECT nodename || ':' || nodeport FROM pg_dist_node
                                          WHERE shouldhaveshards AND groupid <> 0 AND nodename || ':' || nodeport <> '$home' LIMIT 1")
  sum_counters="SELECT sum(lambda_invoke(id, 'get')::bigint) FROM ids"
  increments_before=$(psql "$coordinator" -X -Atq -c "$sum_counters")
  spans=()
  moves_from=$(date +%s.%N)
  # One client on the hot counter, so that its 40001s are the migration's
  # (two clients incrementing one counter conflict all the time).
  load hot 1 1 1
  local hot_pid=${pids[-1]}
  load others 2 "$COUNTERS" 7
  local others_pid=${pids[-1]}
  migrate_at "$(awk "BEGIN {print $MIGRATION_SECONDS / 3}")" "$away" "to $(worker "$away")"
  migrate_at "$(awk "BEGIN {print $MIGRATION_SECONDS * 2 / 3}")" "$home" "back to $(worker "$home")"
  local failed=0
  wait "$hot_pid" || failed=1
  wait "$others_pid" || failed=1
  "$bin/lambdastore-bench" timeline --start "$moves_from" --duration "${MIGRATION_SECONDS}s" --step 250ms \
    --title "A counter moved between two workers under load: throughput per 250 ms" \
    --series "the counter that moves, 1 client=$(ls "$work"/hot.[0-9]* | paste -sd,)" \
    --series "999 other counters, 7 clients=$(ls "$work"/others.[0-9]* | paste -sd,)" \
    "${spans[@]}" --out "${MIGRATION_PLOT:-$repo/bench/results/citus-migration}"
  # Script 1 is write.sql: every increment that committed must be there.
  local committed now
  committed=$(cat "$work"/hot.[0-9]* "$work"/others.[0-9]* | awk '$4 == 1 && $3 != "failed"' | wc -l)
  now=$(psql "$coordinator" -X -Atq -c "$sum_counters")
  echo "increments committed: $committed; the counters grew by $((now - increments_before))"
  # pgbench retries 40001 and 40P01; any other error aborts its client.
  local aborted
  aborted=$(cat "$work/hot.out" "$work/others.out" | grep -c "aborted" || true)
  echo "clients aborted by other errors: $aborted"
  if [ "$failed" != 0 ] || [ "$aborted" != 0 ] || [ "$committed" != "$((now - increments_before))" ]; then
    cat "$work/hot.out" "$work/others.out" >&2
    echo "FAIL: errors other than retried serialization failures, or lost increments" >&2
    exit 1
  fi
}

# h: a hot account (hot_1..hot_3), u: a customer (customer_1..customer_100).
cat >"$work/contended.sql" <<'SQL'
\set h random(1, 3)
\set u random(1, 100)
\set op random(1, 100)
SELECT id AS hot FROM contended WHERE role = 'hot' AND k = :h \gset
SELECT id AS customer FROM contended WHERE role = 'customer' AND k = :u \gset
\if :op <= 40
SELECT lambda_invoke(:customer, 'transfer', jsonb_build_object('to', :hot, 'amount', 1));
\elif :op <= 80
SELECT lambda_invoke(:hot, 'transfer', jsonb_build_object('to', :customer, 'amount', 1));
\else
SELECT lambda_invoke(:hot, 'total_with', jsonb_build_object('other', :customer));
\endif
SQL

# pgbench on URL with CLIENTS clients, the lambdastore settings of LABEL
# (see CONTENDED_SETTINGS), logging each transaction to $work/LOG.*.
contend() {
  local url=$1 clients=$2 label=$3 log=$4 options=() setting
  if [ "$label" != default ]; then
    for setting in ${label//,/ }; do options+=("-c lambdastore.$setting"); done
  fi
  PGOPTIONS="${options[*]}" \
    pgbench "$url" -n -c "$clients" -j 1 -t "${CONTENDED_OPS:-300}" --max-tries=100 -l --log-prefix "$work/$log" \
      -f "$work/contended.sql" >"$work/$log.out" 2>&1 \
    || { cat "$work/$log.out" >&2; return 1; }
}

# One row of the contended table from the logs LOG*.*: operations committed,
# retries per committed operation, operations that gave up, p50 and p99 ms.
# A log line is: client, transaction, time (µs, or "failed"), script, epoch
# s, epoch µs, retries.
contended_row() {
  cat "$work/$1"*.[0-9]* | awk '
    $3 == "failed" { gave_up++; next }
    { ok++; retries += $NF; print $3 > "/dev/stderr" }
    END { printf "%d %.2f %d", ok, retries / (ok ? ok : 1), gave_up }' 2>"$work/$1.latencies"
  sort -n "$work/$1.latencies" | awk '{v[NR] = $1} END {printf " %.1f %.1f\n", v[int(NR * 0.5) + 1] / 1000, v[int(NR * 0.99) + 1] / 1000}'
  rm -f "$work/$1"*.[0-9]*
}

contended_part() {
  # The accounts in a table on every node (the clients on the workers look
  # them up there too): on the cluster, 3 on one worker, 100 on the other.
  local table="CREATE TABLE contended (role text, k int, id bigint, PRIMARY KEY (role, k))"
  psql "$coordinator" -X -q -v ON_ERROR_STOP=1 <<SQL
$table;
CREATE TEMP TABLE placed AS
SELECT a.k, a.id, p.groupid FROM accounts a
  JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', a.id);
INSERT INTO contended
SELECT 'hot', row_number() OVER (ORDER BY k), id FROM placed
 WHERE groupid = (SELECT min(groupid) FROM placed) ORDER BY k LIMIT 3;
INSERT INTO contended
SELECT 'customer', row_number() OVER (ORDER BY k), id FROM placed
 WHERE groupid <> (SELECT min(groupid) FROM placed) ORDER BY k LIMIT 100;
SQL
  local rows w1 w2
  rows=$(psql "$coordinator" -X -Atq -c "COPY contended TO STDOUT")
  w1=$("$citus" url citus-bench w1)
  w2=$("$citus" url citus-bench w2)
  for url in "$w1" "$w2"; do
    psql "$url" -X -q -v ON_ERROR_STOP=1 -c "$table" -c "COPY contended FROM STDIN" <<<"$rows"
  done
  psql "$single" -X -q -v ON_ERROR_STOP=1 -c "$table" \
    -c "INSERT INTO contended SELECT 'hot', k, id FROM accounts WHERE k <= 3 UNION ALL SELECT 'customer', k - 3, id FROM accounts WHERE k BETWEEN 4 AND 103"
  : >"$work/contended-rows"
  local round label settings=${CONTENDED_SETTINGS:-commit_wait=0 default}
  for round in $(seq "$ROUNDS"); do
    for label in $settings; do
      contend "$coordinator" 6 "$label" cluster &
      local c=$!
      contend "$w1" 5 "$label" cluster-w1 &
      local x=$!
      contend "$w2" 5 "$label" cluster-w2
      wait "$c" "$x"
      echo "cluster $label $(contended_row cluster)" >>"$work/contended-rows"
      contend "$single" 16 "$label" single
      echo "single $label $(contended_row single)" >>"$work/contended-rows"
    done
  done
  echo "| 16 clients, 3 hot accounts, 100 others | settings | ops committed | retries / op | gave up (100 tries) | p50 ms | p99 ms |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  local where
  for where in single cluster; do
    for label in $settings; do
      awk -v w="$where" -v l="$label" '$1 == w && $2 == l' "$work/contended-rows" >"$work/rows"
      echo "| $where | $label | $(median_of "$work/rows" 3) | $(median_of "$work/rows" 4) | $(median_of "$work/rows" 5) | $(median_of "$work/rows" 6) | $(median_of "$work/rows" 7) |"
    done
  done
  echo "runs (where, settings, ops, retries/op, gave up, p50, p99):"
  cat "$work/contended-rows"
}

# The gateway part makes its own data (lambdastore-bench http).
case $PARTS in *table*|*delegated*|*migration*|*contended*) setup "$coordinator" ;; esac
case $PARTS in *table*|*contended*) setup "$single" ;; esac
for part in $PARTS; do
  echo
  "${part}_part"
done
