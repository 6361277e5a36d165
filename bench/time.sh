#!/usr/bin/env bash
# Time and the queue (issue 45), on a cluster of its own with the default
# two job runners:
#
#   1. Due-to-done latency of delayed jobs: 200 `tally` jobs, one per
#      object, due every 10 ms from 2 s after they are submitted; the time
#      from each one's `run_after` to its `finished_at` (when its worker
#      committed it: the start plus a sub-millisecond run). With idle
#      workers, then with busy ones (a backlog of 3,000 jobs of another
#      application, `hash` of 64 SHA-512 rounds each, queued first).
#   2. Jobs per second draining 10,000 `tally` jobs (5 per object, one
#      transaction submits them all), with no delayed jobs pending and
#      with 10,000 (then 100,000) pending for tomorrow, ROUNDS rounds each
#      (each after a VACUUM ANALYZE, as autovacuum between bursts), medians.
#   3. The runners' private memory (RssAnon: resident, not shared buffers
#      or files; summed) with none, 10,000 and 100,000 delayed jobs
#      pending, after a drain.
#
#   bench/time.sh        # needs `make lambdas install` first; ROUNDS=3
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
ROUNDS=${ROUNDS:-3}
export LAMBDASTORE_PORT=${LAMBDASTORE_PORT:-54337}
"$cluster" fresh benchtime >/dev/null
trap '"$cluster" stop benchtime' EXIT
sql() { "$cluster" psql benchtime -d lambdastore_test -X -v ON_ERROR_STOP=1 -Atq "$@"; }

sql -c "CREATE EXTENSION lambdastore"
LAMBDASTORE_WASM=$repo/target/lambdas/micro.wasm sql >/dev/null <<'SQL'
\set wasm `base64 -w0 "$LAMBDASTORE_WASM"`
SELECT lambdastore.deploy('timed', decode(:'wasm', 'base64'));
SELECT lambdastore.deploy('other', decode(:'wasm', 'base64'));
CREATE TABLE objects AS
SELECT k, lambdastore.create_object('timed', 'Bench', '{"entries": 0}') AS id FROM generate_series(1, 2000) k;
CREATE TABLE others AS
SELECT k, lambdastore.create_object('other', 'Bench', '{"entries": 0}') AS id FROM generate_series(1, 100) k;
SQL

# Polls (every 10 ms, at most 10 minutes) until no job of `app` is queued
# and due: in one session, so that the polling costs the runners little,
# committing at each look: a snapshot held through the drain keeps every
# finished job's index entry alive for the claims to step over (a 10,000
# job drain ran at 60 jobs/s under one).
drained() {
  sql -c "DO \$\$ BEGIN
            FOR i IN 1..60000 LOOP
              EXIT WHEN NOT EXISTS (SELECT FROM lambdastore.jobs
                                     WHERE app = '$1' AND state = 'queued' AND run_after <= clock_timestamp());
              COMMIT;
              PERFORM pg_sleep(0.01);
            END LOOP;
            IF EXISTS (SELECT FROM lambdastore.jobs
                        WHERE app = '$1' AND state = 'queued' AND run_after <= clock_timestamp()) THEN
              RAISE EXCEPTION '$1''s jobs still queued after 10 minutes';
            END IF;
          END \$\$"
}

# latency LABEL: p50 and p99 of due-to-done, in ms, of 200 delayed jobs.
latency() {
  sql -c "DELETE FROM lambdastore.jobs WHERE app = 'timed'"
  sql -c "SELECT lambdastore.submit(id, 'tally', jsonb_build_object('tag', k),
                                    delay => interval '2 seconds' + k * interval '10 milliseconds')
            FROM objects WHERE k <= 200" >/dev/null
  sleep 4.5 # the last job is due 4 s after submission; drained() then waits for the rest
  drained timed
  sql -c "SELECT format('| %s | %s | %s |', '$1',
                        round((percentile_cont(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
                        round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1))
            FROM (SELECT extract(epoch FROM finished_at - run_after) * 1000 AS ms
                    FROM lambdastore.jobs WHERE app = 'timed' AND state = 'done') l"
}

# Warm: the runners' first job of an application loads its module.
sql -c "SELECT lambdastore.submit(id, 'tally', '{\"tag\": 0}') FROM objects WHERE k <= 2
        UNION ALL SELECT lambdastore.submit(id, 'tally', '{\"tag\": 0}') FROM others WHERE k <= 2" >/dev/null
drained timed
drained other
echo "| 200 delayed jobs, due every 10 ms | due-to-done p50 ms | p99 ms |"
echo "|---|---:|---:|"
latency "idle workers"
sql -c "SELECT lambdastore.submit(id, 'hash', '{\"n\": 64}') FROM others, generate_series(1, 30)" >/dev/null
latency "busy workers (3,000 jobs of another application queued first)"
drained other

# drain: jobs per second running 10,000 jobs (5 per object, each round
# over all objects, so that the two runners' jobs are of two objects) from
# the commit that queued them all until none is left.
drain() {
  sql -c "DELETE FROM lambdastore.jobs WHERE app = 'timed' AND state <> 'queued'"
  # What autovacuum does between bursts: the finished jobs' dead index
  # entries gone, statistics that know the table's size (a fresh table's
  # plans probe it by a sequential scan).
  sql -c "VACUUM ANALYZE lambdastore.jobs"
  local start end
  start=$(sql -c "SELECT count(lambdastore.submit(o.id, 'tally', '{\"tag\": 1}'))
                    FROM generate_series(1, 5) g, (SELECT id FROM objects ORDER BY k) o;
                  SELECT extract(epoch FROM clock_timestamp())" | tail -1)
  drained timed
  end=$(sql -c "SELECT extract(epoch FROM clock_timestamp())")
  echo "$start $end" | awk '{printf "%.0f", 10000 / ($2 - $1)}'
}
runner_rss_mb() {
  sql -c "SELECT round(sum(substring(pg_read_file('/proc/' || pid || '/status') FROM 'RssAnon:\s+(\d+)')::bigint) / 1024.0, 1)
            FROM pg_stat_activity WHERE backend_type = 'lambdastore job runner'"
}
# pending N: N delayed jobs (due tomorrow) of `other`, in all.
pending() {
  local have
  have=$(sql -c "SELECT count(*) FROM lambdastore.jobs WHERE app = 'other' AND state = 'queued'")
  [ "$1" -gt "$have" ] || return 0
  sql -c "SELECT lambdastore.submit(o.id, 'tally', '{\"tag\": 2}', delay => interval '1 day')
            FROM others o, generate_series(1, ($1 - $have) / 100)" >/dev/null
}

declare -A rates=() memory=()
for pending_jobs in 0 10000 100000; do
  pending "$pending_jobs"
  for round in $(seq "$ROUNDS"); do
    rates[$pending_jobs]+="$(drain) "
  done
  memory[$pending_jobs]=$(runner_rss_mb)
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
echo
echo "| delayed jobs pending | jobs/s draining 10,000 (median of $ROUNDS) | runs | runners' private memory after, MB |"
echo "|---:|---:|---|---:|"
for pending_jobs in 0 10000 100000; do
  echo "| $pending_jobs | $(echo "${rates[$pending_jobs]}" | median) | ${rates[$pending_jobs]}| ${memory[$pending_jobs]} |"
done
