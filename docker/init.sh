#!/bin/sh
# Makes running nodes a LambdaStore cluster; `lambdastore-init` in the
# lambdastore/postgres image, the one-shot `init` of docker-compose.yml. Each
# step is idempotent: a second `docker compose up` changes nothing.
#
#   lambdastore-init cluster   the database on every node, citus on each, the workers
#                              registered with the coordinator, lambdastore created
#                              there (Citus creates it on the workers), its tables
#                              distributed (scripts/citus.sh runs this step too)
#   lambdastore-init gateway   the gateway's role, and an API key for the forum
#                              application kept in $LAMBDASTORE_STATE/gateway.key while
#                              it is valid (scripts/demo-gateway.sh runs this step too)
#   lambdastore-init demo      the forum application deployed, the gateway step, a few
#                              objects spread over the workers; prints the key, where
#                              each object lives and a curl for each call
#
#   LAMBDASTORE_COORDINATOR    host:port (default 127.0.0.1:5432)
#   LAMBDASTORE_WORKERS        host:port,host:port,... as the nodes reach each other
#   LAMBDASTORE_DATABASE       default lambdastore
#   LAMBDASTORE_GATEWAY_URL    the gateway's address, for the printed curl commands
#   LAMBDASTORE_STATE          where the key and the demo's ids are kept (/var/lib/lambdastore)
set -eu
coordinator=${LAMBDASTORE_COORDINATOR:-127.0.0.1:5432}
workers=$(echo "${LAMBDASTORE_WORKERS:-}" | tr ',' ' ')
db=${LAMBDASTORE_DATABASE:-lambdastore}
gateway_url=${LAMBDASTORE_GATEWAY_URL:-http://127.0.0.1:8080}
state=${LAMBDASTORE_STATE:-/var/lib/lambdastore}
lambdas=${LAMBDASTORE_LAMBDAS:-/usr/share/lambdastore/lambdas}

# sql NODE [DATABASE] [psql args...]: one statement or a script on stdin.
sql() {
  local node=$1 dbname=$db
  shift
  case ${1:-} in -*|'') ;; *) dbname=$1; shift ;; esac
  psql -d "host=${node%:*} port=${node##*:} user=postgres dbname=$dbname" -X -Atq -v ON_ERROR_STOP=1 "$@"
}

cluster() {
  for node in $coordinator $workers; do
    deadline=$(($(date +%s) + 60))
    until pg_isready -q -h "${node%:*}" -p "${node##*:}"; do
      if [ "$(date +%s)" -ge "$deadline" ]; then echo "lambdastore-init: $node is not ready after 60 s" >&2; exit 1; fi
      sleep 0.2
    done
    if [ "$(sql "$node" postgres -c "SELECT count(*) FROM pg_database WHERE datname = '$db'")" = 0 ]; then
      sql "$node" postgres -c "CREATE DATABASE $db"
    fi
    # Before the worker is added: citus_add_node needs citus on it.
    sql "$node" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS citus"
  done
  # Each node reaches the others by the address it is registered under.
  sql "$coordinator" -c "SELECT citus_set_coordinator_host('${coordinator%:*}', ${coordinator##*:})
                          WHERE NOT EXISTS (SELECT FROM pg_dist_node WHERE groupid = 0)" >/dev/null
  for node in $workers; do
    sql "$coordinator" -c "SELECT citus_add_node('${node%:*}', ${node##*:})
                            WHERE NOT EXISTS (SELECT FROM pg_dist_node
                                               WHERE nodename = '${node%:*}' AND nodeport = ${node##*:})" >/dev/null
  done
  # Created after the workers are added, so that Citus creates it on each.
  sql "$coordinator" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS lambdastore"
  for node in $workers; do
    if [ "$(sql "$node" -c "SELECT count(*) FROM pg_extension WHERE extname = 'lambdastore'")" != 1 ]; then
      echo "lambdastore-init: Citus did not create lambdastore on $node" >&2; exit 1
    fi
  done
  # lambdastore.distribute() came with Citus support; an older build has none.
  sql "$coordinator" >/dev/null <<'SQL'
SELECT to_regprocedure('lambdastore.distribute(integer)') IS NOT NULL AS distribute \gset
\if :distribute
SELECT lambdastore.distribute();
\endif
SQL
}

gateway() {
  # docs/gateway.md's least-privilege role for the gateway, without a password:
  # the nodes trust 127.0.0.1.
  sql "$coordinator" <<'SQL'
SELECT 'CREATE ROLE lambdastore_gateway LOGIN'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lambdastore_gateway')
\gexec
GRANT USAGE ON SCHEMA lambdastore_gateway TO lambdastore_gateway;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO lambdastore_gateway;
-- On a Citus cluster the gateway calls the workers too: Citus has created
-- the role there, but leaves grants on an extension's objects to each node.
DO $$
DECLARE
    statement text;
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        FOREACH statement IN ARRAY ARRAY[
            'GRANT USAGE ON SCHEMA lambdastore_gateway TO lambdastore_gateway',
            'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lambdastore_gateway TO lambdastore_gateway'] LOOP
            IF EXISTS (SELECT FROM run_command_on_workers(statement) WHERE NOT success) THEN
                RAISE EXCEPTION 'lambdastore-init: "%" failed on a worker', statement;
            END IF;
        END LOOP;
    END IF;
END
$$;
SQL
  # A key is shown only when it is made: the first run keeps it, later runs
  # show it again while it is valid.
  key=$(cat "$state/gateway.key" 2>/dev/null || true)
  valid=$(sql "$coordinator" -v key="$key" <<'SQL'
SELECT count(*) FROM lambdastore.api_keys
 WHERE app = 'forum' AND revoked IS NULL AND sha256 = sha256(convert_to(:'key', 'UTF8'))
SQL
)
  if [ "$valid" != 1 ]; then
    key=$(sql "$coordinator" -c "SELECT api_key FROM lambdastore.create_api_key('forum', 'lambdastore-init')")
    (umask 077 && echo "$key" >"$state/gateway.key")
  fi
}

demo() {
  deployed=$(LAMBDASTORE_WASM=$lambdas/forum.wasm sql "$coordinator" <<'SQL'
\set wasm `base64 -w0 "$LAMBDASTORE_WASM"`
SELECT format('forum version %s', d->>'version') FROM lambdastore.deploy('forum', decode(:'wasm', 'base64')) d;
SQL
)
  gateway

  # Made from the coordinator, the objects land on the workers their ids
  # hash to; a thread lives with the account that started it, and nested
  # calls reach objects on any node.
  ids=$(cat "$state/demo.ids" 2>/dev/null || true)
  if [ -z "$ids" ] || [ "$(sql "$coordinator" -c "SELECT count(*) FROM lambdastore.objects
                                                 WHERE object_id IN ($(echo "$ids" | tr ' ' ','))")" != 4 ]; then
    ids=$(sql "$coordinator" <<'SQL'
SELECT lambdastore.create_object('forum', 'Account', '{"name": "alice"}') AS alice,
       lambdastore.create_object('forum', 'Account', '{"name": "bob"}') AS bob,
       lambdastore.create_object('forum', 'Community', '{"name": "databases"}') AS community \gset
SELECT :alice, :bob, :community,
       lambda_invoke(:alice, 'create_thread', jsonb_build_object(
         'community', :community, 'title', 'Lambdas next to the data', 'text', 'Why ship state to code?'));
SQL
)
    ids=$(echo "$ids" | tr '|' ' ')
    echo "$ids" >"$state/demo.ids"
  fi
  set -- $ids
  bob=$2 thread=$4
  placed=$(sql "$coordinator" <<SQL
SELECT format('   %s %s on %s', what, id, n.nodename || ':' || n.nodeport)
  FROM (VALUES (1, 'account (alice)', $1), (2, 'account (bob)', $2), (3, 'community', $3), (4, 'thread', $4))
       v (rank, what, id)
  JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', id)
  JOIN pg_dist_node n USING (groupid)
 ORDER BY rank
SQL
)

  auth="-H 'Authorization: Bearer $key'"
  echo "== LambdaStore on Citus: the coordinator $coordinator, the workers $workers, database $db"
  echo "== $deployed; API key: $key"
  echo "$placed"
  echo "   bob comments on alice's thread, over HTTP (the gateway, $gateway_url):"
  echo "   curl -sS $auth -H 'content-type: application/json' -d '{\"thread\": $thread, \"text\": \"hello over HTTP\"}' $gateway_url/v1/objects/$bob/methods/add_comment"
  echo "   the thread:"
  echo "   curl -sS $auth -X POST $gateway_url/v1/objects/$thread/methods/get_thread"
  echo "   SQL on the coordinator: psql -h ${coordinator%:*} -p ${coordinator##*:} -U postgres $db"
}

[ $# -gt 0 ] || { echo "usage: lambdastore-init cluster|gateway|demo..." >&2; exit 2; }
for step in "$@"; do
  case $step in
    cluster) cluster ;;
    gateway) gateway ;;
    demo) demo ;;
    *) echo "lambdastore-init: unknown step $step (cluster, gateway, demo)" >&2; exit 2 ;;
  esac
done
