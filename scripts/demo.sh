#!/usr/bin/env bash
# `make demo`: the CloudForum application on a project-owned single-node
# PostgreSQL, then the same over HTTP (scripts/demo-gateway.sh). Idempotent:
# rerunning redeploys (unchanged), adds more data and restarts the gateway.
#
# With LAMBDASTORE_DEMO_URL (a libpq conninfo), only the SQL part runs,
# against that database: `make demo-citus` (scripts/demo-citus.sh) points
# it at a Citus coordinator, and keeps its server to itself.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
wasm=$repo/target/lambdas/forum.wasm
url=${LAMBDASTORE_DEMO_URL:-}
sql() { psql -d "$url" -v ON_ERROR_STOP=1 -X -q "$@"; }

if [ -z "$url" ]; then
  "$cluster" start demo >/dev/null

  # A running server keeps the library it loaded: after a new `make
  # install`, restart the demo server, then move its database to the
  # installed version with the upgrade scripts (extension/sql). Only a
  # build of the same version with other SQL (between two releases) has no
  # script from the database's schema: then the database is recreated.
  library=$(sha256sum <"$(pg_config --pkglibdir)/lambdastore.so" | cut -c1-16)
  schema=$(cat "$(pg_config --sharedir)"/extension/lambdastore--*.sql | sha256sum | cut -c1-16)
  stamp=$("$cluster" dir demo)/extension.sha256
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$library $schema" ]; then
    echo "== the installed extension changed since the last demo: restarting the server"
    "$cluster" stop demo
    "$cluster" start demo >/dev/null
    demo_sql() { "$cluster" psql demo -d lambdastore_demo -X -Atq -v ON_ERROR_STOP=1 "$@"; }
    versions=$(demo_sql -c "SELECT e.extversion || ' ' || a.default_version FROM pg_extension e
                              JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'lambdastore'" \
                 2>/dev/null || true)
    if [ -n "$versions" ] && [ "${versions% *}" != "${versions#* }" ]; then
      echo "== ALTER EXTENSION lambdastore UPDATE: ${versions% *} -> ${versions#* }"
      demo_sql -c "ALTER EXTENSION lambdastore UPDATE"
    elif [ -n "$versions" ] && [ "$(cut -d' ' -f2 "$stamp")" != "$schema" ]; then
      echo "== a build of the same version (${versions% *}) with other SQL: recreating lambdastore_demo"
      "$cluster" psql demo -d postgres -qc "DROP DATABASE IF EXISTS lambdastore_demo WITH (FORCE)"
    fi
  fi
  echo "$library $schema" > "$stamp"

  "$cluster" psql demo -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'lambdastore_demo'" | grep -q 1 \
    || "$cluster" psql demo -d postgres -qc "CREATE DATABASE lambdastore_demo"
  url=$("$cluster" url demo)
  url=${url/dbname=postgres/dbname=lambdastore_demo}
fi
sql -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS lambdastore"

echo "== deploy forum.wasm ($(stat -c %s "$wasm") bytes)"
# psql reads the file on the client side (the server, running as another
# user, may not see the checkout); on the server pg_read_binary_file does it.
LAMBDASTORE_WASM=$wasm sql -At <<'SQL'
\set wasm `base64 -w0 "$LAMBDASTORE_WASM"`
SELECT format('app %s version %s (sha256 %s…), types: %s', d->>'app', d->>'version', left(d->>'sha256', 12),
              (SELECT string_agg(t->>'name', ', ') FROM jsonb_array_elements(d->'types') t))
  FROM lambdastore.deploy('forum', decode(:'wasm', 'base64')) d;
SQL

echo "== create objects and run a short workload (200 comments, 1000 reads)"
sql -At <<'SQL'
\timing off
SELECT lambdastore.create_object('forum', 'Account', '{"name": "alice"}') AS alice \gset
SELECT lambdastore.create_object('forum', 'Account', '{"name": "bob"}') AS bob \gset
SELECT lambdastore.create_object('forum', 'Community', '{"name": "databases"}') AS db \gset
SELECT lambda_invoke(:alice, 'create_thread',
       jsonb_build_object('community', :db, 'title', 'Lambdas next to the data', 'text', 'Why ship state to code?')) AS thread \gset
SELECT clock_timestamp() AS t0 \gset
SELECT count(lambda_invoke(CASE WHEN i % 2 = 0 THEN :alice ELSE :bob END, 'add_comment',
                           jsonb_build_object('thread', :thread, 'text', 'comment ' || i)))
  FROM generate_series(1, 200) i \gset
SELECT round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) * 1000 / 200, 3) AS write_ms \gset
SELECT clock_timestamp() AS t0 \gset
SELECT count(lambda_invoke(:thread, 'get_thread')) FROM generate_series(1, 1000) \gset
SELECT round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz) * 1000 / 1000, 3) AS read_ms \gset
\echo accounts :alice (alice) and :bob (bob), community :db, thread :thread
\echo add_comment (nested call Account -> Thread): :write_ms ms per call
\echo get_thread: :read_ms ms per call
SELECT format('thread %s: "%s" by account %s, %s comments; latest: %s',
              :thread, t->>'title', t->>'author', t->>'comment_count',
              (SELECT c->>'text' FROM jsonb_array_elements(t->'comments') c ORDER BY (c->>'id')::int DESC LIMIT 1))
  FROM lambda_invoke(:thread, 'get_thread') t;
\echo
\echo the data is ordinary rows:
SELECT format('  %s objects, %s entries in lambdastore.entries', (SELECT count(*) FROM lambdastore.objects),
              (SELECT count(*) FROM lambdastore.entries));
SQL

echo
echo "== errors are precise and leave nothing behind, e.g. a protected function called from SQL:"
thread=$(sql -Atc "SELECT max(object_id) FROM lambdastore.objects WHERE type_name = 'Thread'")
sql -c "SELECT lambda_invoke($thread, 'add_comment', '{\"author\": 1, \"text\": \"spam\"}')" 2>&1 | sed 's/^/  /' || true

echo
# The idempotency key names this run's thread: reused for another call it is refused.
echo "== an asynchronous job: a background worker adds the comment, exactly once"
alice=$(sql -Atc "SELECT min(object_id) FROM lambdastore.objects WHERE type_name = 'Account'")
sql -At <<SQL
SELECT lambdastore.submit($alice, 'add_comment', '{"thread": $thread, "text": "posted by a job"}', 'demo-job-$thread') AS job \gset
SELECT format('  job %s: %s, result %s, after %s run(s)', job_id, state, result, attempts)
  FROM lambdastore.wait(:job, '10 seconds');
SELECT format('  queue: %s', string_agg(format('%s.%s done %s failed %s waiting %s', app, function, done, failed, depth), '; '))
  FROM lambdastore.queue;
SQL

# The gateway serves the single-node demo; a caller with a server of its
# own says itself how to connect.
if [ -n "${LAMBDASTORE_DEMO_URL:-}" ]; then exit 0; fi

echo
echo "== the same over HTTP: the gateway in front of the demo database, one call with curl"
"$repo/scripts/demo-gateway.sh" start "$alice" "$thread"

echo
echo "== connect:  psql \"$url\""
echo "   (or: scripts/cluster.sh psql demo -d lambdastore_demo);  stop the server and the gateway with: make stop"
