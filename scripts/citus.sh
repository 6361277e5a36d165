#!/usr/bin/env bash
# A local Citus cluster owned by the project: a coordinator NAME-coord and
# workers NAME-w1..wN, each a scripts/cluster.sh node on 127.0.0.1. Used by
# `make test-citus` ("citus-test", ports 54340, 54341, ...),
# `make demo-citus` ("citus-demo", ports 54350, 54351, ...) and
# `make bench-citus` ("citus-bench", ports 54360, 54361, ...) and
# scripts/upgrade.sh ("citus-upgrade", ports 54370, 54371, ...).
#
#   scripts/citus.sh start|fresh|stop|status|nodes NAME
#   scripts/citus.sh url NAME [NODE]            # libpq conninfo of the database on NODE
#   scripts/citus.sh crash-node NAME NODE       # pg_ctl restart -m immediate
#   scripts/citus.sh psql NAME [NODE] [psql args...]
#
# NODE is coord (the default) or w1..w9. LAMBDASTORE_CITUS_WORKERS sets the
# number of workers (default 2, at most 9); `start` also starts any other
# node that a previous start created.
#
# `start` is idempotent and prints the coordinator's conninfo: it starts
# every node (initdb on the first start), creates citus in the database on
# each, registers the workers with the coordinator, creates lambdastore on
# the coordinator (Citus creates it on the workers) and distributes
# lambdastore's tables. `fresh` deletes every node's data first.
set -euo pipefail

usage="usage: citus.sh start|fresh|stop|status|nodes|url|crash-node|psql NAME [NODE] [psql args...]"
cmd=${1:?$usage}
name=${2:?$usage}
shift 2
case $name in
  citus-test) db=lambdastore_test ;;
  citus-demo) db=lambdastore_demo ;;
  citus-bench) db=lambdastore_bench ;;
  citus-upgrade) db=lambdastore_test ;;
  *) echo "unknown Citus cluster $name: citus-test, citus-demo, citus-bench or citus-upgrade" >&2; exit 2 ;;
esac
node=
case ${1:-} in coord|w[1-9]) node=$1; shift ;; esac

repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
workers=${LAMBDASTORE_CITUS_WORKERS:-2}
case $workers in
  [1-9]) ;;
  *) echo "LAMBDASTORE_CITUS_WORKERS must be 1 to 9, not $workers" >&2; exit 2 ;;
esac

url() {
  local url
  url=$("$cluster" url "$name-$1")
  echo "${url/dbname=postgres/dbname=$db}"
}

# The nodes on disk, coordinator first: `stop`, `status` and `nodes` find
# them all, whatever LAMBDASTORE_CITUS_WORKERS was when they were started.
existing() {
  local base n
  base=$(dirname "$("$cluster" dir "$name-coord")")
  for n in coord w1 w2 w3 w4 w5 w6 w7 w8 w9; do
    if [ -d "$base/$name-$n" ]; then echo "$n"; fi
  done
}

start() {
  local pkglib nodes n addresses
  pkglib=$(pg_config --pkglibdir)
  if [ ! -f "$pkglib/citus.so" ]; then
    echo "Citus is not installed (no citus.so in $pkglib): install Citus 13 from Citus' own packages; on a development machine of this project, ../shared/citus/install.sh" >&2
    exit 3
  fi
  # The nodes there are and the workers asked for: a worker once added
  # stays in the coordinator's metadata, and queries need it running.
  nodes=$( { existing; echo coord; seq -f 'w%g' "$workers"; } | sort -u)
  for n in $nodes; do "$cluster" start "$name-$n" >/dev/null; done
  # The rest is what the containers' init does (docker/init.sh): citus on
  # every node, the workers registered (sort put coord first), lambdastore
  # created on the coordinator (Citus creates it on each worker), distributed.
  addresses=$(for n in ${nodes#coord}; do echo "127.0.0.1:$("$cluster" port "$name-$n")"; done | paste -sd,)
  LAMBDASTORE_COORDINATOR=127.0.0.1:$("$cluster" port "$name-coord") LAMBDASTORE_WORKERS=$addresses \
    LAMBDASTORE_DATABASE=$db "$repo/docker/init.sh" cluster
  url coord
}

stop() {
  local n
  # The coordinator first: it would keep reconnecting to stopped workers.
  for n in $(existing); do "$cluster" stop "$name-$n"; done
}

case $cmd in
  start) start ;;
  fresh)
    stop
    for n in $(existing); do rm -rf "$("$cluster" dir "$name-$n")"; done
    start
    ;;
  stop) stop ;;
  status)
    for n in $(existing); do
      if "$cluster" status "$name-$n" >/dev/null 2>&1; then state=running; else state=stopped; fi
      echo "$name-$n port $("$cluster" port "$name-$n"): $state"
    done
    ;;
  nodes) existing ;;
  url) url "${node:-coord}" ;;
  crash-node)
    [ -n "$node" ] || { echo "$usage" >&2; exit 2; }
    "$cluster" crash "$name-$node"
    ;;
  psql) exec "$cluster" psql "$name-${node:-coord}" -d "$db" "$@" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
