#!/usr/bin/env bash
# `ALTER EXTENSION lambdastore UPDATE` keeps every row (issue 42): the
# previous release (git tag $LAMBDASTORE_UPGRADE_FROM, default v0.1.0) is
# built from its tag and installed into a private copy of PostgreSQL's
# installation, a database gets data of every kind, the server restarts on
# this build, and the update must keep every row, every call, the queued
# job (run once, after) and the keys. Then the upgraded schema is compared
# with a fresh install of this build: any difference (a schema change
# without its extension/sql/lambdastore--A--B.sql) fails the test.
# Part of `make test-e2e`, after `make install` (its package is the new
# build); one cluster of its own on 127.0.0.1, removed at the end.
#
# The copy of the installation (bin, lib, share; PostgreSQL finds its
# files relative to its binaries) keeps the old library away from the
# server every other test uses. The old build shares the target directory,
# so only the extension crate itself is compiled again (about 30 s).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
from_tag=${LAMBDASTORE_UPGRADE_FROM:-v0.1.0}
cluster=$repo/scripts/cluster.sh
pg_config=$(command -v "${PG_CONFIG:-pg_config}")
new_package=$repo/target/package
target=${CARGO_TARGET_DIR:-$repo/target}
export LAMBDASTORE_PORT=${LAMBDASTORE_UPGRADE_PORT:-54333} # and the next one, for pg_upgrade
name=upgrade
db=lambdastore_test

[ -f "$new_package$("$pg_config" --pkglibdir)/lambdastore.so" ] \
  || { echo "no build in $new_package: run make install (scripts/install.sh) first" >&2; exit 1; }
# A clone made without tags still has the commit (5467e01 is v0.1.0).
if ! git -C "$repo" rev-parse -q --verify "$from_tag^{commit}" >/dev/null; then
  [ "$from_tag" = v0.1.0 ] && from_tag=5467e01a2a365c158566771bfcd20442bda03bdd
  git -C "$repo" rev-parse -q --verify "$from_tag^{commit}" >/dev/null \
    || { echo "FAIL: no git tag $from_tag in $repo (a shallow clone? git fetch --tags --unshallow)" >&2; exit 1; }
fi
new_version=$(sed -n 's/^default_version = .\(.*\).$/\1/p' "$new_package$("$pg_config" --sharedir)/extension/lambdastore.control")

# Runs a build of the previous release with this build's outputs whose file
# names carry no hash (a cdylib's, a wasm module's) kept aside and put back
# after it: both versions build the same file, and a later build of this
# version whose fingerprint is fresh would use whatever file is there
# (pgrx reads the extension's SQL from the library too). $1 the outputs'
# directory, $2 their names, then the build's command line.
with_outputs_kept() {
  local dir=$1 names=$2 status=0 name file
  shift 2
  for name in $names; do
    for file in "$dir/$name" "$dir/deps/$name"; do
      if [ -f "$file" ]; then cp -p "$file" "$file.kept"; fi
    done
  done
  "$@" || status=$?
  for name in $names; do
    for file in "$dir/$name" "$dir/deps/$name"; do
      if [ -f "$file.kept" ]; then mv -f "$file.kept" "$file"; else rm -f "$file"; fi
    done
  done
  return $status
}

# The previous release's package, built once per tag commit.
old_package=$target/upgrade/$(git -C "$repo" rev-parse "$from_tag^{commit}")
if [ ! -f "$old_package/done" ]; then
  echo "== building $from_tag"
  rm -rf "$old_package" && mkdir -p "$old_package/src"
  # -m: the files are new, so Cargo compiles them even if its fingerprint
  # of an earlier build of the tag looks fresh (see with_outputs_kept).
  # wasmtime with this build's features (Cranelift's incremental cache,
  # which the old library never turns on), so that Cranelift as this build
  # compiled it serves the old one too: 2.5 minutes less.
  git -C "$repo" archive "$from_tag" | tar -x -m -C "$old_package/src"
  (cd "$old_package/src/extension" && export CARGO_TARGET_DIR=$target && \
    with_outputs_kept "$target/release" liblambdastore.so \
    cargo pgrx package --pg-config "$pg_config" --out-dir "$old_package/package" \
    --features wasmtime/incremental-cache >"$old_package/build.log" 2>&1) \
    || { tail -20 "$old_package/build.log" >&2; exit 1; }
  touch "$old_package/done"
fi
old_version=$(sed -n 's/^default_version = .\(.*\).$/\1/p' "$old_package/package$("$pg_config" --sharedir)/extension/lambdastore.control")

# The previous release's lambdas, built from its source: the data it holds
# was made by lambdas of its time, and lambdas built now may import what it
# lacks (the `later` interface of timers). They share the target directory
# too (their dependencies are this build's), and are componentized by this
# build's tool straight from the build, before this build's modules are put
# back.
old_lambdas=$old_package/lambdas
if [ ! -f "$old_lambdas/done" ]; then
  echo "== building $from_tag's lambdas"
  rm -rf "$old_lambdas" && mkdir -p "$old_lambdas"
  [ -x "$target/release/lambdastore-componentize" ] || cargo build --release -q -p lambdastore-componentize
  wasm=$target/wasm32-unknown-unknown/release
  (cd "$old_package/src" && export CARGO_TARGET_DIR=$target && with_outputs_kept "$wasm" "counter.wasm micro.wasm" sh -c '
    cargo build --release --target wasm32-unknown-unknown -p counter -p micro &&
      for app in counter micro; do "$1/release/lambdastore-componentize" "$2/$app.wasm" "$3/$app.wasm"; done
  ' old-lambdas "$target" "$wasm" "$old_lambdas" >"$old_package/lambdas.log" 2>&1) \
    || { tail -20 "$old_package/lambdas.log" >&2; exit 1; }
  touch "$old_lambdas/done"
fi

# The private installation: a copy of the server's bin, lib and share.
"$cluster" stop "$name" 2>/dev/null || true
base=$(dirname "$("$cluster" dir "$name")")
root=$base/upgrade-pg
rm -rf "$root"
for dir in "$("$pg_config" --bindir)" "$("$pg_config" --pkglibdir)" "$("$pg_config" --sharedir)"; do
  mkdir -p "$root$(dirname "$dir")" && cp -a "$dir" "$root$(dirname "$dir")/"
done
root_config=$root$pg_config
[ "$("$root_config" --sharedir)" = "$root$("$pg_config" --sharedir)" ] \
  || { echo "FAIL: the copied PostgreSQL does not find its files beside it" >&2; exit 1; }
# Puts a package's extension files (library, control file, scripts) in the copy.
install_package() {
  rm -f "$root$("$pg_config" --sharedir)"/extension/lambdastore*
  (cd "$1" && find . -type f) | while read -r file; do
    install -D -m 0755 "$1/$file" "$root/${file#./}"
  done
}
export PATH=$root$("$pg_config" --bindir):$PATH # cluster.sh takes pg_config from PATH
new_cluster=$base/upgrade-new # pg_upgrade's target
if [ "$(id -u)" = 0 ]; then as_pg() { runuser -u postgres -- "$@"; }; else as_pg() { "$@"; }; fi
stop_all() {
  as_pg "$("$pg_config" --bindir)/pg_ctl" -D "$new_cluster/data" -m immediate -w stop >/dev/null 2>&1 || true
  "$cluster" stop "$name" || true
  rm -rf "$root" "$new_cluster" "$("$cluster" dir "$name")"
}
trap stop_all EXIT

sql() { "$cluster" psql "$name" -d "${DB:-$db}" -v ON_ERROR_STOP=1 -X -Atq "$@"; }
check() { # check WHAT EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then echo "FAIL: $1: expected '$2', got '$3'" >&2; exit 1; fi
  echo "ok: $1"
}
restart() { "$cluster" stop "$name" && "$cluster" start "$name" >/dev/null; }
# What 0.2.0 added to the jobs, on an updated table: a delayed job of
# OBJECT cancelled (the new state passes the table's check) and a
# schedule's tick run. jobs_of_0_2_0 OBJECT WHERE
jobs_of_0_2_0() {
  local delayed tick
  delayed=$(sql -c "SELECT lambdastore.submit($1, 'increment', '{}', delay => interval '1 hour')")
  check "a delayed job cancelled $2" t "$(sql -c "SELECT lambdastore.cancel($delayed)")"
  sql -c "SELECT lambdastore.schedule('upgraded', '* * * * * *', $1, 'increment')" >/dev/null
  tick=$(sql -c "SELECT min(job_id) FROM lambdastore.jobs WHERE schedule = 'upgraded'")
  check "a schedule's tick $2" done "$(sql -c "SELECT state FROM lambdastore.wait($tick, '60 seconds')")"
  check "unschedule $2" t "$(sql -c "SELECT lambdastore.unschedule($1, 'upgraded')")"
}
# The extension's tables and their columns in the old version
# (remember_tables, before the update): what the update must keep. A table
# or column the update adds is new (checked by the calls after it).
declare -A columns=()
remember_tables() {
  local table
  columns=()
  for table in $(sql -c "SELECT c.oid::regclass FROM pg_class c
                           JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
                          WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'lambdastore')
                            AND c.relkind = 'r' ORDER BY 1"); do
    columns[$table]=$(sql -c "SELECT string_agg(format('t.%I', attname), ', ' ORDER BY attnum) FROM pg_attribute
                               WHERE attrelid = '$table'::regclass AND attnum > 0 AND NOT attisdropped")
  done
}
# Every row of those tables, in key order: a digest per table.
contents() {
  local table row
  for table in $(printf '%s\n' "${!columns[@]}" | sort); do
    row="ROW(${columns[$table]})::text"
    sql -c "SELECT format('%s %s %s', '$table', count(*), coalesce(md5(string_agg($row, '|' ORDER BY $row)), '')) FROM $table t"
  done
}

echo "== $old_version (from $from_tag): data of every kind"
install_package "$old_package/package"
"$cluster" fresh "$name" >/dev/null
sql -c "CREATE EXTENSION lambdastore"
check "the old version" "$old_version" "$(sql -c "SELECT extversion FROM pg_extension WHERE extname = 'lambdastore'")"
deploy() { sql -c "SELECT lambdastore.deploy('$1', pg_read_binary_file('$old_lambdas/$2.wasm')) IS NOT NULL" >/dev/null; }
deploy counter counter
deploy counter micro # a second version,
deploy counter counter # and back: three rows of modules
deploy micro micro
counter=$(sql -c "SELECT lambdastore.create_object('counter', 'Counter')")
other=$(sql -c "SELECT lambdastore.create_object('counter', 'Counter')")
bench=$(sql -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 0}')")
for _ in 1 2 3; do sql -c "SELECT lambda_invoke($counter, 'increment')" >/dev/null; done
for key in a b c; do sql -c "SELECT lambda_invoke($bench, 'put', '{\"key\": \"$key\", \"value\": \"$key$key\"}')" >/dev/null; done
sql -c "SELECT lambdastore.split($bench, 'kv', convert_to('b', 'UTF8'))" >/dev/null # a second entry set
sql -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS upgrade_caller" -c "CREATE ROLE upgrade_caller"
sql -c "SELECT lambdastore.grant('counter', 'upgrade_caller', 'invoke')" >/dev/null
key=$(sql -c "SELECT api_key FROM lambdastore.create_api_key('counter', 'upgrade')")
sql -c "SELECT replayed FROM lambdastore._call('counter', 'once', jsonb_build_array('invoke', $other::int8, 'increment', '{}'::jsonb))" >/dev/null
done_job=$(sql -c "SELECT lambdastore.submit($other, 'increment', '{}', 'done-job')")
check "a job run by $old_version" done "$(sql -c "SELECT state FROM lambdastore.wait($done_job, '60 seconds')")"
# A job still queued at the upgrade: the runners are off until after it.
sql -c "ALTER SYSTEM SET lambdastore.workers = 0" && restart
queued_job=$(sql -c "SET client_min_messages = error" -c "SELECT lambdastore.submit($other, 'increment', '{}', 'queued-job')")
remember_tables
before=$(contents)
check "rows in every table but the Citus ones" 0 \
  "$(printf '%s\n' "$before" | awk '$2 == 0 && $1 != "lambdastore.migrations" && $1 != "lambdastore.job_keys"' | wc -l)"

echo "== $old_version -> $new_version: ALTER EXTENSION lambdastore UPDATE"
"$cluster" stop "$name"
install_package "$new_package"
"$cluster" start "$name" >/dev/null
sql -c "ALTER EXTENSION lambdastore UPDATE"
check "the new version" "$new_version" "$(sql -c "SELECT extversion FROM pg_extension WHERE extname = 'lambdastore'")"
after=$(contents)
if [ "$before" != "$after" ]; then
  diff <(echo "$before") <(echo "$after") >&2 || true
  echo "FAIL: the update changed rows" >&2; exit 1
fi
echo "ok: every row of every table kept"
check "a call on an old object" 3 "$(sql -c "SELECT lambda_invoke($counter, 'get')")"
check "a write on an old object" 4 "$(sql -c "SELECT lambda_invoke($counter, 'increment')")"
check "entries kept" '"bb"' "$(sql -c "SELECT lambda_invoke($bench, 'get', '{\"key\": \"b\"}')")"
new_object=$(sql -c "SELECT lambdastore.create_object('counter', 'Counter')")
[ "$new_object" -gt "$bench" ] || { echo "FAIL: a new object got id $new_object, not after $bench" >&2; exit 1; }
echo "ok: a new object after the old ids"
check "the API key" counter "$(sql -c "SELECT lambdastore._api_key_app('$key')")"
check "the idempotency key's stored answer" t \
  "$(sql -c "SELECT replayed FROM lambdastore._call('counter', 'once', jsonb_build_array('invoke', $other::int8, 'increment', '{}'::jsonb))")"
check "the grant" 5 "$(sql -c "SET ROLE upgrade_caller" -c "SELECT lambda_invoke($counter, 'increment')")"
check "the job's idempotency key" "$queued_job" "$(sql -c "SELECT lambdastore.submit($other, 'increment', '{}', 'queued-job')")"
sql -c "ALTER SYSTEM RESET lambdastore.workers" && restart
check "the queued job ran after the update" done "$(sql -c "SELECT state FROM lambdastore.wait($queued_job, '60 seconds')")"
# other: 1 (the idempotent call) + 1 (the done job) + 1 (the queued job, once).
check "the queued job ran once" 3 "$(sql -c "SELECT lambda_invoke($other, 'get')")"
jobs_of_0_2_0 "$other" "after the update"

echo "== the upgraded schema against a fresh install of $new_version"
sql -c "CREATE DATABASE fresh"
DB=fresh sql -c "CREATE EXTENSION lambdastore"
# --binary-upgrade dumps the extension's members one by one; the lines
# that name OIDs, transaction ids or sequence values differ between any
# two databases.
schema() {
  pg_dump -h "$("$cluster" dir "$name")/run" -p "$LAMBDASTORE_PORT" -U postgres -d "$1" --schema-only --binary-upgrade \
    | grep -v -E -e '^(--.*|)$' -e '^SELECT pg_catalog\.(binary_upgrade_set_next|setval)' -e '^\\(un)?restrict ' \
        -e "^SET relfrozenxid|^WHERE oid = '[0-9]+';" \
    | sed -E "/binary_upgrade_create_empty_extension/s/'\{[0-9,]+\}'/'{the tables pg_dump keeps}'/"
  # Those tables, by name.
  DB=$1 sql -c "SELECT string_agg(c::regclass::text, ' ' ORDER BY c::regclass::text)
                  FROM pg_extension, unnest(extconfig) c WHERE extname = 'lambdastore'"
}
if ! diff -u <(schema fresh) <(schema "$db") >"$base/upgrade-schema.diff"; then
  cat "$base/upgrade-schema.diff" >&2
  echo "FAIL: the upgraded schema (+) differs from a fresh install (-): extension/sql/lambdastore--$old_version--$new_version.sql misses the change" >&2
  exit 1
fi
echo "ok: the upgraded schema is a fresh install's"
echo "== pg_upgrade: this server's data into a new cluster of $(dirname "$pg_config")"
# Two installations of one major version stand for two majors: what
# pg_upgrade checks and carries over (every extension's library, the
# catalog, the tables' files) is the same. The new cluster preloads
# lambdastore, as the old one does.
"$cluster" stop "$name"
rm -rf "$new_cluster" && mkdir -p "$new_cluster/run"
[ "$(id -u)" = 0 ] && chown -R postgres:postgres "$new_cluster"
bindir=$("$pg_config" --bindir)
as_pg "$bindir/initdb" -D "$new_cluster/data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >/dev/null
printf "shared_preload_libraries = 'lambdastore'\nlambdastore.database = '%s'\n" "$db" >>"$new_cluster/data/postgresql.conf"
pg_upgrade() {
  (cd "$new_cluster" && as_pg "$bindir/pg_upgrade" "$@" -U postgres -b "$root$bindir" -B "$bindir" \
     -d "$("$cluster" dir "$name")/data" -D "$new_cluster/data" \
     -p "$LAMBDASTORE_PORT" -P "$((LAMBDASTORE_PORT + 1))" >"$new_cluster/pg_upgrade.log" 2>&1) \
    || { cat "$new_cluster/pg_upgrade.log" >&2; echo "FAIL: pg_upgrade $*" >&2; exit 1; }
}
pg_upgrade --check
check "pg_upgrade --check" 1 "$(grep -c "Clusters are compatible" "$new_cluster/pg_upgrade.log")"
pg_upgrade
as_pg env -u RUST_BACKTRACE "$bindir/pg_ctl" -D "$new_cluster/data" -l "$new_cluster/postgresql.log" -w -t 60 \
  -o "-p $((LAMBDASTORE_PORT + 1)) -k $new_cluster/run -c listen_addresses=''" start >/dev/null
upgraded() { "$bindir/psql" -h "$new_cluster/run" -p "$((LAMBDASTORE_PORT + 1))" -U postgres -d "$db" -X -Atq -v ON_ERROR_STOP=1 "$@"; }
# pg_upgrade keeps role OIDs under a new system identifier: what stores a
# role (a job) is refused until a superuser says the OIDs are kept
# (operations.md, "Roles after a restore into another server").
identifier() { as_pg "$bindir/pg_controldata" "$1" | sed -n 's/^Database system identifier: *//p'; }
check "a new system identifier" 1 \
  "$([ "$(identifier "$("$cluster" dir "$name")/data")" != "$(identifier "$new_cluster/data")" ] && echo 1)"
refused=$(upgraded -c "SELECT lambdastore.submit($counter, 'get')" 2>&1 || true)
check "a job refused before the roles are kept" 1 "$(grep -c "another server's" <<<"$refused")"
upgraded -c "SELECT lambdastore.adopt_restored_roles(keep_oids => true)" >/dev/null
after_pg_upgrade=$(upgraded -c "SELECT lambda_invoke($counter, 'increment')")
as_pg "$bindir/pg_ctl" -D "$new_cluster/data" -m fast -w stop >/dev/null
check "a call after pg_upgrade" 6 "$after_pg_upgrade"
rm -rf "$new_cluster"
if grep -E "terminated by signal|PANIC" "$("$cluster" log "$name")"; then
  echo "FAIL: a server process crashed" >&2; exit 1
fi
"$cluster" stop "$name"

# The same on a Citus cluster (coordinator and two workers, "citus-upgrade"):
# the update runs on the coordinator, and Citus runs it on every worker.
citus=$repo/scripts/citus.sh
if [ ! -f "$root$("$pg_config" --pkglibdir)/citus.so" ]; then
  [ "${LAMBDASTORE_REQUIRE_CITUS:-}" = 1 ] && { echo "FAIL: Citus is not installed" >&2; exit 1; }
  echo "upgrade from $from_tag ($old_version) to $new_version: passed (not on Citus: it is not installed)"
  exit 0
fi
echo "== on a Citus cluster: $old_version, distributed"
csql() { "$citus" psql citus-upgrade "${NODE:-coord}" -v ON_ERROR_STOP=1 -X -Atq "$@"; }
nodes() { "$citus" nodes citus-upgrade; }
stop_citus() {
  "$citus" stop citus-upgrade >/dev/null 2>&1 || true
  for n in $(nodes); do rm -rf "$("$cluster" dir "citus-upgrade-$n")"; done
}
trap 'stop_citus; stop_all' EXIT
install_package "$old_package/package"
"$citus" fresh citus-upgrade >/dev/null
sql() { csql "$@"; }
# The node holding an object's shard.
node_of() {
  sql -c "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
           WHERE p.shardid = get_shard_id_for_distribution_column('lambdastore.objects', $1::bigint)"
}
deploy counter counter
deploy micro micro
counters=$(for _ in 1 2 3 4 5 6; do sql -c "SELECT lambdastore.create_object('counter', 'Counter')"; done)
n=0
for counter in $counters; do
  n=$((n + 1))
  for _ in $(seq "$n"); do sql -c "SELECT lambda_invoke($counter, 'increment')" >/dev/null; done
done
check "counters on both workers" 2 "$(for counter in $counters; do node_of "$counter"; done | sort -u | wc -l)"
bench=$(sql -c "SELECT lambdastore.create_object('micro', 'Bench', '{\"entries\": 0}')")
for key in a b c; do sql -c "SELECT lambda_invoke($bench, 'put', '{\"key\": \"$key\", \"value\": \"$key$key\"}')" >/dev/null; done
sql -c "SELECT lambdastore.split($bench, 'kv', convert_to('b', 'UTF8'))" >/dev/null
key=$(sql -c "SELECT api_key FROM lambdastore.create_api_key('counter', 'upgrade')")
first=$(echo "$counters" | head -1)
done_job=$(sql -c "SELECT lambdastore.submit($first, 'increment', '{}', 'done-job')")
check "a job run by $old_version on a worker" done "$(sql -c "SELECT state FROM lambdastore.wait($done_job, '60 seconds')")"
# applications' placements, and those with a foreign key (to modules).
placement_keys() {
  sql -c "SELECT count(*), count(*) FILTER (WHERE success AND result::int > 0)
            FROM run_command_on_placements('lambdastore.applications',
                   \$\$SELECT count(*) FROM pg_constraint WHERE conrelid = '%s'::regclass AND contype = 'f'\$\$)"
}
placements=$(placement_keys | cut -d'|' -f1)
check "$old_version's foreign key on each placement of applications" "$placements|$placements" "$(placement_keys)"
remember_tables
before=$(contents)

echo "== on a Citus cluster: $old_version -> $new_version"
"$citus" stop citus-upgrade
install_package "$new_package"
for n in $(nodes); do "$cluster" start "citus-upgrade-$n" >/dev/null; done
sql -c "ALTER EXTENSION lambdastore UPDATE"
# Until then a call fails (55000: the tables are only partly distributed).
check "distribute() takes the tables 0.2.0 added (schedules, queue_limits, light_replicas)" "already distributed; 3 new tables distributed" \
  "$(sql -c "SELECT lambdastore.distribute()")"
for n in $(nodes); do
  check "the new version on $n" "$new_version" "$(NODE=$n csql -c "SELECT extversion FROM pg_extension WHERE extname = 'lambdastore'")"
done
after=$(contents)
if [ "$before" != "$after" ]; then
  diff <(echo "$before") <(echo "$after") >&2 || true
  echo "FAIL: the update changed rows on the cluster" >&2; exit 1
fi
echo "ok: every row of every table kept on the cluster"
n=0
for counter in $counters; do
  n=$((n + 1))
  expected=$((n + 1)); [ "$counter" = "$first" ] && expected=$((n + 2)) # and the job's
  check "a write on counter $counter (node port $(node_of "$counter"))" "$expected" \
    "$(sql -c "SELECT lambda_invoke($counter, 'increment')")"
done
check "entries kept on the cluster" '"bb"' "$(sql -c "SELECT lambda_invoke($bench, 'get', '{\"key\": \"b\"}')")"
check "the API key on the cluster" counter "$(sql -c "SELECT lambdastore._api_key_app('$key')")"
new_object=$(sql -c "SELECT lambdastore.create_object('counter', 'Counter')")
[ "$new_object" -gt "$bench" ] || { echo "FAIL: a new object got id $new_object, not after $bench" >&2; exit 1; }
echo "ok: a new object after the old ids on the cluster"
# What the update changed in the catalog holds on the workers' shards too.
check "no foreign key on any placement of applications" "$placements|0" "$(placement_keys)"
# The jobs' new check and columns reached the workers' shards.
jobs_of_0_2_0 "$first" "on its worker after the update"
"$citus" stop citus-upgrade
for n in $(nodes); do
  if grep -E "terminated by signal|PANIC" "$("$cluster" log "citus-upgrade-$n")"; then
    echo "FAIL: a server process crashed on $n" >&2; exit 1
  fi
done
echo "upgrade from $from_tag ($old_version) to $new_version: passed, on one server and on Citus"
