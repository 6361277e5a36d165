#!/usr/bin/env bash
# A PostgreSQL cluster owned by the project: initdb on first start, pg_ctl
# for the rest. Used by `make demo` (name "demo") and `make test` ("test").
#
#   scripts/cluster.sh start|fresh|stop|crash|status|url|port|log|dir|psql NAME [psql args...]
#   scripts/cluster.sh standby NAME PRIMARY
#
# `fresh` stops the cluster, deletes its data and starts it anew. `standby`
# does the same with a hot standby of cluster PRIMARY (running):
# `pg_basebackup -R -X stream` of it, on this cluster's port.
#
# `crash` is `pg_ctl restart -m immediate`: every process is killed without
# a checkpoint and the server recovers from the WAL (used by the job tests).
#
# A node of a Citus cluster (scripts/citus.sh) is named CLUSTER-coord or
# CLUSTER-wN: it preloads citus before lambdastore, and takes its port from
# the cluster's (coordinator on the base port, worker N on base + N).
#
# The data directory is .lambdastore/NAME under the repository. PostgreSQL
# refuses to run as root, so as root the cluster runs as the `postgres`
# user, under /tmp/lambdastore-<repo hash>/NAME (postgres may not be able
# to enter a root-owned checkout).
set -euo pipefail

cmd=${1:?usage: cluster.sh start|stop|status|url|psql NAME}
name=${2:?cluster name}
shift 2 || true

repo=$(cd "$(dirname "$0")/.." && pwd)
bindir=$(pg_config --bindir)
citus=
case $name in
  demo) port=${LAMBDASTORE_DEMO_PORT:-54329}; db=lambdastore_demo ;;
  test) port=${LAMBDASTORE_TEST_PORT:-54330}; db=lambdastore_test ;;
  citus-demo-coord|citus-demo-w[1-9]) citus=54350; db=lambdastore_demo ;;
  citus-test-coord|citus-test-w[1-9]) citus=54340; db=lambdastore_test ;;
  citus-bench-coord|citus-bench-w[1-9]) citus=54360; db=lambdastore_bench ;;
  citus-upgrade-coord|citus-upgrade-w[1-9]) citus=54370; db=lambdastore_test ;;
  *)    port=${LAMBDASTORE_PORT:-54331}; db=lambdastore_test ;;
esac
if [ -n "$citus" ]; then
  node=${name##*-}
  if [ "$node" = coord ]; then port=$citus; else port=$((citus + ${node#w})); fi
fi

if [ "$(id -u)" = 0 ]; then
  base=/tmp/lambdastore-$(printf %s "$repo" | sha1sum | cut -c1-8)
  as_pg() { runuser -u postgres -- "$@"; }
else
  base=$repo/.lambdastore
  as_pg() { "$@"; }
fi
dir=$base/$name
data=$dir/data
run=$dir/run
log=$dir/postgresql.log

url() { echo "host=$run port=$port user=postgres dbname=postgres"; }

# Runs a command that starts the server without the descriptors this script
# was given beyond 0-2: the postmaster would keep them open for its whole
# life, e.g. the lock of `flock LOCK make demo`, held until `make stop`.
without_fds() (
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    [ "$fd" -gt 2 ] && eval "exec $fd>&-"
  done
  "$@"
)

case $cmd in
  standby)
    primary=$base/${1:?usage: cluster.sh standby NAME PRIMARY}
    primary_port=$(sed -n "s/^port = //p" "$primary/data/postgresql.conf" | tail -n 1)
    "$0" stop "$name"
    rm -rf "$dir" && mkdir -p "$run"
    [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$dir"
    as_pg "$bindir/pg_basebackup" -h "$primary/run" -p "$primary_port" -U postgres -D "$data" -R -X stream
    # The copied settings are the primary's: its port and socket directory.
    printf "port = %s\nunix_socket_directories = '%s'\n" "$port" "$run" | as_pg tee -a "$data/postgresql.conf" >/dev/null
    exec "$0" start "$name"
    ;;
  fresh)
    "$0" stop "$name"
    # The log too: e2e.sh greps it for crashes of this cluster's run only.
    rm -rf "$data" "$log"
    exec "$0" start "$name"
    ;;
  start)
    mkdir -p "$dir" "$run"
    # This cluster's directory only: another suite's cluster under $base may
    # be created or deleted at the same moment (make test runs two lanes).
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$base" && chown -R postgres:postgres "$dir"
    if [ ! -f "$data/PG_VERSION" ]; then
      as_pg "$bindir/initdb" -D "$data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >"$dir/initdb.log"
      cat >>"$data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$run'
max_connections = 200
shared_buffers = 256MB
fsync = off                 # a disposable development cluster
# A commit is in the WAL (written, not flushed: fsync is off) before it is
# acknowledged, so that a process crash (pg_ctl restart -m immediate, which
# the tests make) never loses one: with this off, a sweep's idempotent
# calls through the gateway lost 22 of 3,377 acknowledged increments.
synchronous_commit = on
full_page_writes = off
log_min_messages = warning
# PREPARE TRANSACTION reaches the extension's checks (and Citus' 2PC needs it).
max_prepared_transactions = 10
# Loaded once in the postmaster and inherited by every backend, so a new
# connection does not pay for loading the library (see docs/operations.md).
shared_preload_libraries = 'lambdastore'
# The background job runners serve one database.
lambdastore.database = '$db'
CONF
      # PostgreSQL takes a setting's last line: these override the above.
      if [ -n "$citus" ]; then cat >>"$data/postgresql.conf" <<CONF
# A Citus node: citus must come first among the preloaded libraries.
shared_preload_libraries = 'citus,lambdastore'
# Citus moves shards with logical replication.
wal_level = logical
# Citus commits a transaction that wrote on several nodes with 2PC.
max_prepared_transactions = 100
# The nodes talk over 127.0.0.1 only; Citus' default (sslmode=require)
# would make CREATE EXTENSION citus turn on SSL with a self-signed key.
citus.node_conninfo = 'sslmode=disable'
# Prepared transactions a crash leaves behind are ended by Citus' recovery;
# until then a worker that restarted refuses OCC validation (40001): see
# docs/ARCHITECTURE.md, "On a Citus cluster". Sooner than the default 60 s.
citus.recover_2pc_interval = '5s'
CONF
      fi
    fi
    if ! as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      # The ports are in Linux's ephemeral range: a client connection that
      # was given the port as its local one makes the bind fail until it
      # closes (seen in CI, which now reserves 54320-54399: .ci/run; as
      # root, `sysctl -w net.ipv4.ip_local_reserved_ports=54320-54399`).
      # Such a start is tried again, a few times.
      for attempt in 1 2 3 4 5; do
        # Without RUST_BACKTRACE, pgrx does not append Rust backtraces to errors.
        without_fds as_pg env -u RUST_BACKTRACE "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null && break
        if [ "$attempt" = 5 ] || ! tail -n 5 "$log" | grep -q "could not create any TCP/IP sockets"; then exit 1; fi
        echo "port $port is taken for now: starting $name again" >&2
        sleep 1 # waiting out another process's connection, which nothing signals
      done
    fi
    # The workers' database, so that they can connect from the start.
    pg_psql() { "$bindir/psql" -h "$run" -p "$port" -U postgres -d postgres -X -Atq "$@"; }
    pg_psql -c "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
      || pg_psql -c "CREATE DATABASE $db" >/dev/null
    url
    ;;
  crash)
    without_fds as_pg env -u RUST_BACKTRACE "$bindir/pg_ctl" -D "$data" -l "$log" -m immediate -w -t 60 restart >/dev/null
    ;;
  stop)
    if [ -f "$data/PG_VERSION" ] && as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      as_pg "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null
    fi
    ;;
  status) as_pg "$bindir/pg_ctl" -D "$data" status ;;
  url) url ;;
  port) echo "$port" ;;
  log) echo "$log" ;;
  dir) echo "$dir" ;;
  psql) exec psql -h "$run" -p "$port" -U postgres "$@" ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
