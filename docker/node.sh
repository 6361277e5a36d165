#!/bin/sh
# The entrypoint of lambdastore/postgres: a node of the cluster. The first
# start makes the data directory ($PGDATA); every start runs the server in
# the foreground, as the container's own process, so that `docker stop`
# (SIGINT: fast shutdown) and `docker kill` reach it. Arguments are the
# server's (`-c name=value`).
#
#   LAMBDASTORE_PORT      the port (default 5432)
#   LAMBDASTORE_LISTEN    listen_addresses (default 127.0.0.1)
#   LAMBDASTORE_DATABASE  the database whose jobs the node runs (default lambdastore);
#                         lambdastore-init creates it
#
# Every connection from 127.0.0.1 is trusted, as in the project's local
# clusters: the nodes are reachable on the loopback interface only.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  initdb -D "$PGDATA" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
  echo "include '/etc/lambdastore/node.conf'" >>"$PGDATA/postgresql.conf"
fi
exec postgres -D "$PGDATA" -c port="${LAMBDASTORE_PORT:-5432}" \
  -c listen_addresses="${LAMBDASTORE_LISTEN:-127.0.0.1}" \
  -c lambdastore.database="${LAMBDASTORE_DATABASE:-lambdastore}" "$@"
