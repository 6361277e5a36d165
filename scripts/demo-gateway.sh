#!/usr/bin/env bash
# The HTTP side of `make demo`: builds the gateway, gives it its role and
# the forum app an API key (as docs/gateway.md, "Setting it up", does),
# starts it in the background in front of the demo database and makes one
# call with curl. `make stop` stops it.
#
#   scripts/demo-gateway.sh start ACCOUNT THREAD   # comments on THREAD as ACCOUNT
#   scripts/demo-gateway.sh stop
#
# A rerun restarts the gateway (a rebuilt binary takes over) and keeps the
# key. Its pid, log and key are kept in the demo cluster's directory.
# LAMBDASTORE_DEMO_GATEWAY_PORT sets the port (default 8089).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
cluster=$repo/scripts/cluster.sh
dir=$("$cluster" dir demo)
pidfile=$dir/gateway.pid
log=$dir/gateway.log
keyfile=$dir/gateway.key
port=${LAMBDASTORE_DEMO_GATEWAY_PORT:-8089}
base=http://127.0.0.1:$port

# The pid of the gateway this script started, if it still runs (checked by
# its command line: the pid file may outlive it and the pid be reused).
running() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  grep -qs lambdastore-gateway "/proc/$pid/cmdline" && echo "$pid"
}

stop() {
  local pid
  if pid=$(running); then
    kill -TERM "$pid"
    # SIGTERM lets in-flight requests finish, at most --shutdown-timeout.
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "the demo gateway (pid $pid) did not stop" >&2; exit 1; fi
    echo "stopped the demo gateway (pid $pid)"
  fi
  rm -f "$pidfile"
}

case ${1:-} in
  stop) stop; exit 0 ;;
  start) account=${2:?account id}; thread=${3:?thread id} ;;
  *) echo "usage: demo-gateway.sh start ACCOUNT THREAD | stop" >&2; exit 2 ;;
esac

cargo build --release -p lambdastore-gateway
bin=${CARGO_TARGET_DIR:-target}/release/lambdastore-gateway

# docs/gateway.md's least-privilege role, and an API key for forum kept in the
# demo cluster's directory while it is valid: the containers' init step.
LAMBDASTORE_COORDINATOR=127.0.0.1:$("$cluster" port demo) LAMBDASTORE_DATABASE=lambdastore_demo \
  LAMBDASTORE_STATE=$dir "$repo/docker/init.sh" gateway
key=$(cat "$keyfile")

stop >/dev/null
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "port $port is taken by another program: set LAMBDASTORE_DEMO_GATEWAY_PORT" >&2; exit 1
fi
db_url=$("$cluster" url demo)
db_url=${db_url/user=postgres dbname=postgres/user=lambdastore_gateway dbname=lambdastore_demo}
# In a session of its own and with no descriptor but the log: it outlives
# `make demo`, and an inherited one (the lock of `flock LOCK make demo`, a
# pipe to `| tail`) would stay open as long as it runs.
(
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    [ "$fd" -gt 2 ] && eval "exec $fd>&-"
  done
  exec setsid "$bin" --database-url "$db_url" --listen "127.0.0.1:$port" --shutdown-timeout 5s \
    </dev/null >"$log" 2>&1
) &
pid=$!
echo "$pid" >"$pidfile"

deadline=$((SECONDS + 30))
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/readyz")" = 200 ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "the gateway exited; the end of $log:" >&2; tail -5 "$log" >&2; exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "the gateway is not ready after 30 s; see $log" >&2; exit 1
  fi
  sleep 0.1
done

echo "   gateway pid $pid on $base (role lambdastore_gateway), log $log"
echo "   API key for the forum app: $key"
# Shown as typed and run as shown: the key and ids are [A-Za-z0-9_].
call="curl -sS --fail-with-body -H 'Authorization: Bearer $key' -H 'content-type: application/json' \\
       -d '{\"thread\": $thread, \"text\": \"posted over HTTP\"}' $base/v1/objects/$account/methods/add_comment"
echo "   \$ $call"
echo "   $(eval "$call")"
