#!/usr/bin/env bash
# `make demo-citus`: LambdaStore on a local Citus cluster, "citus-demo"
# (scripts/citus.sh): the coordinator on 54350, the workers on 54351,
# 54352, ... Counters spread over the workers, every call run on the node
# holding its object, one transaction writing on two nodes, a job; then
# the CloudForum demo of `make demo` in SQL (scripts/demo.sh), whose nested
# calls go from one worker to another. Idempotent: a rerun adds more data.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
citus=$repo/scripts/citus.sh

# As in demo.sh: running nodes keep the library they loaded, and the
# extension has no upgrade scripts yet, so after a new `make install` the
# cluster starts anew rather than mix two versions.
installed=$(cat "$(pg_config --pkglibdir)/lambdastore.so" "$(pg_config --sharedir)"/extension/lambdastore--*.sql \
  | sha256sum | cut -c1-16)
stamp=$("$repo/scripts/cluster.sh" dir citus-demo-coord)/extension.sha256
if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$installed" ]; then
  echo "== the installed extension changed since the last demo: a fresh citus-demo cluster"
  "$citus" fresh citus-demo >/dev/null
fi
url=$("$citus" start citus-demo)
echo "$installed" >"$stamp"
echo "== citus-demo: $("$citus" psql citus-demo -Atc "SELECT count(*) FROM citus_get_active_worker_nodes()") workers"

# How to connect is printed after a failing demo too: the cluster is there
# to look at.
status=0
wasm=$repo/target/lambdas/counter.wasm
LAMBDASTORE_WASM=$wasm psql -d "$url" -v ON_ERROR_STOP=1 -X -q <<'SQL' || status=$?
\set wasm `base64 -w0 "$LAMBDASTORE_WASM"`
\echo == deploy counter.wasm on the coordinator (Citus copies it to every node)
SELECT format('app %s version %s', d->>'app', d->>'version') AS deployed
  FROM lambdastore.deploy('counter', decode(:'wasm', 'base64')) d;
\echo == six counters, created from the coordinator: each lives on the worker its id hashes to
CREATE TEMP TABLE demo AS
SELECT lambdastore.create_object('counter', 'Counter', format('{"initial": %s}', i * 10)::jsonb) AS id
  FROM generate_series(1, 6) i;
SELECT d.id, n.nodename || ':' || n.nodeport AS stored_on, lambda_invoke(d.id, 'increment') AS after_increment
  FROM demo d
  JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', d.id)
  JOIN pg_dist_node n USING (groupid)
 ORDER BY 2, 1;
\echo == one transaction, counters on two workers: committed on both (two-phase commit) or on neither
SELECT min(id) AS a, max(id) AS b FROM demo \gset
BEGIN;
SELECT lambda_invoke(:a, 'add', '{"n": -5}') AS a_after, lambda_invoke(:b, 'add', '{"n": 5}') AS b_after;
COMMIT;
\echo == a job, submitted on the coordinator, run by the job runners of the worker holding the counter
SELECT lambdastore.submit(:a, 'increment') AS job \gset
SELECT state, result FROM lambdastore.wait(:job, '10 seconds');
SQL
if [ $status = 0 ]; then
  echo
  echo "== CloudForum on the cluster: accounts, communities and threads on both workers"
  LAMBDASTORE_DEMO_URL=$url "$repo/scripts/demo.sh" || status=$?
fi

echo
echo "== connect to the coordinator:  psql \"$url\""
for node in $("$citus" nodes citus-demo | grep -v coord); do
  echo "   worker $node:  psql \"$("$citus" url citus-demo "$node")\""
done
echo "   (or: scripts/citus.sh psql citus-demo [w1|w2...]);  stop the cluster with: make stop"
exit $status
