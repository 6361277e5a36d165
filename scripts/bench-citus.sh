#!/usr/bin/env bash
# `make bench-citus`: one node against the local Citus cluster, side by
# side in one run (the machine is noisy): pgbench, 8 clients, on 1,000
# counters, alternating single node and cluster ROUNDS times; medians.
#
#   read-only   SELECT lambda_invoke(id, 'get')                 one call
#   write       SELECT lambda_invoke(id, 'increment')           one call
#   two-object  BEGIN; increment a; increment b; COMMIT         a, b on one node
#   two-node    the same with a and b on two nodes              (two-phase commit)
#   nested-one-node   SELECT lambda_invoke(a, 'transfer', b)    bank: a's lambda calls b.deposit,
#   nested-two-node   the same with a and b on two nodes        a nested call to another node
#   cloudforum  90% Thread.get_thread, 10% Account.add_comment (a nested call to the thread,
#               on another node half the time): 1,000 threads by 200 accounts in 10 communities
#
# The single node is a project cluster ("bench-single", port 54339); the
# cluster is citus-test (a coordinator and two workers), started fresh:
# do not run it beside `make test-citus`. Every call goes through the
# coordinator, which forwards it to the worker holding its object.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
citus=$repo/scripts/citus.sh
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
COUNTERS=1000
work=$(mktemp -d)
trap 'rm -rf "$work"; LAMBDASTORE_PORT=54339 "$cluster" stop bench-single; "$citus" stop citus-test' EXIT

single=$(LAMBDASTORE_PORT=54339 "$cluster" fresh bench-single)
single=${single/dbname=postgres/dbname=lambdastore_test}
coordinator=$("$citus" fresh citus-test)
psql "$single" -X -q -c "CREATE EXTENSION IF NOT EXISTS lambdastore"

# The counters, and a local table of their ids (k = 1..1000), so that the
# scripts pick one without knowing how ids look on a cluster. `pair` holds
# pairs of counters on one node (same = true) or on two (same = false).
setup() {
  LAMBDASTORE_COUNTER=$repo/target/lambdas/counter.wasm LAMBDASTORE_BANK=$repo/target/lambdas/bank.wasm \
    LAMBDASTORE_FORUM=$repo/target/lambdas/forum.wasm psql "$1" -X -q -v ON_ERROR_STOP=1 <<'SQL'
\set counter `base64 -w0 "$LAMBDASTORE_COUNTER"`
\set bank `base64 -w0 "$LAMBDASTORE_BANK"`
\set forum `base64 -w0 "$LAMBDASTORE_FORUM"`
SELECT lambdastore.deploy('counter', decode(:'counter', 'base64')) \gset
SELECT lambdastore.deploy('bank', decode(:'bank', 'base64')) \gset
SELECT lambdastore.deploy('forum', decode(:'forum', 'base64')) \gset
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
SQL
}
setup "$single"
setup "$coordinator"
# Pairs: on one node by the shard's node; on the single node, any two.
for objects in ids:pair accounts:account_pair; do
  psql "$single" -X -q -c "INSERT INTO ${objects#*:} SELECT k, s, k, 1001 - k FROM generate_series(1, 500) k, (VALUES (true), (false)) v(s);
                           UPDATE ${objects#*:} p SET a = (SELECT id FROM ${objects%:*} i WHERE i.k = p.a),
                                                      b = (SELECT id FROM ${objects%:*} i WHERE i.k = p.b)"
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

cat >"$work/read-only.sql" <<'SQL'
\set k random(1, 1000)
SELECT lambda_invoke((SELECT id FROM ids WHERE k = :k), 'get');
SQL
cat >"$work/write.sql" <<'SQL'
\set k random(1, 1000)
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

# pgbench's tps and mean latency, from its summary; serialization failures
# (40001) are retried, as clients of a serializable system do.
run() {
  pgbench "$1" -n -c 8 -j 2 -T "$SECONDS_PER_RUN" --max-tries=1000 -f "$work/$2.sql" 2>/dev/null \
    | awk '/^latency average/ {lat=$4} /^tps/ {tps=$3} END {printf "%.0f %.2f\n", tps, lat}'
}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

echo "| workload | single node tx/s | cluster tx/s | cluster / single | single ms | cluster ms |"
echo "|---|---:|---:|---:|---:|---:|"
for workload in ${WORKLOADS:-read-only write two-object two-node nested-one-node nested-two-node cloudforum}; do
  : >"$work/single" && : >"$work/cluster"
  for _ in $(seq "$ROUNDS"); do
    run "$single" "$workload" >>"$work/single"
    run "$coordinator" "$workload" >>"$work/cluster"
  done
  s_tps=$(cut -d' ' -f1 "$work/single" | median); c_tps=$(cut -d' ' -f1 "$work/cluster" | median)
  s_lat=$(cut -d' ' -f2 "$work/single" | median); c_lat=$(cut -d' ' -f2 "$work/cluster" | median)
  echo "| $workload | $s_tps | $c_tps | $(awk "BEGIN {printf \"%.2f\", $c_tps / $s_tps}") | $s_lat | $c_lat |"
done
