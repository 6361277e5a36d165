#!/usr/bin/env bash
# `make demo-citus`: the CloudForum demo of `make demo` (scripts/demo.sh, its
# SQL part) on a local Citus cluster, "citus-demo" (scripts/citus.sh): the
# coordinator on 54350, the workers on 54351, 54352, ... Idempotent: a
# rerun keeps the cluster and adds more data.
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
LAMBDASTORE_DEMO_URL=$url "$repo/scripts/demo.sh" || status=$?

echo
echo "== connect to the coordinator:  psql \"$url\""
for node in $("$citus" nodes citus-demo | grep -v coord); do
  echo "   worker $node:  psql \"$("$citus" url citus-demo "$node")\""
done
echo "   (or: scripts/citus.sh psql citus-demo [w1|w2...]);  stop the cluster with: make stop"
exit $status
