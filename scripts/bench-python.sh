#!/usr/bin/env bash
# `make bench-python`: a Python guest against a Rust one (issue 46), the
# counter in each language (target/lambdas/counter.wasm, py_counter.wasm),
# on a cluster of its own ("benchpy", port 54346), stopped on exit. Side by
# side in one run, alternating ROUNDS times, medians (of a ratio: of the
# rounds' own ratios):
#
#   deploy     the time `lambdastore.deploy` takes (a Python component's
#              compile; the same bytes again map the cached artifact; other
#              bytes of the same code reuse the compiled functions), and
#              the module's size
#   warm       pgbench -M prepared, `get` and `increment` on 100 counters,
#              1 and 8 clients, SECONDS_PER_RUN each
#   cold       pgbench -C (a new connection per transaction): a bare
#              `SELECT 1`, then one `get` as a session's first call; the
#              first call's cost is the difference. Twice per round, the
#              server restarted before each: with the artifacts mapped by
#              the postmaster at start (lambdastore.preload_artifacts, as
#              for modules deployed before the last restart), and without
#              (as for those deployed since)
#   instance   the time to make a call's instance, to run the call in it
#              and to reset its memory as the store drops, and the size of
#              its linear memory, from the extension's DEBUG2 lines per call
#
#   ROUNDS=3 SECONDS_PER_RUN=5
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=$repo/scripts/cluster.sh
lambdas=$repo/target/lambdas
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
for wasm in counter py_counter; do
  [ -f "$lambdas/$wasm.wasm" ] || { echo "no $lambdas/$wasm.wasm: make lambdas first" >&2; exit 1; }
done
export LAMBDASTORE_PORT=54346
work=$(mktemp -d)
trap 'rm -rf "$work"; "$cluster" stop benchpy' EXIT
url=$("$cluster" fresh benchpy)
psql "$url" -X -q -c "CREATE EXTENSION IF NOT EXISTS lambdastore"

# Deploy each three times under three names: a compile, the cached
# artifact, then other bytes of the same code (a custom section appended,
# as a new version of an application), compiled from the functions the
# first compile kept (lambdastore/functions).
: >"$work/deploy"
for lang in rs:counter py:py_counter; do
  for n in 1 2 3; do
    section=$([ "$n" = 3 ] && echo "\\x0003017633" || echo "\\x")
    ms=$(LAMBDASTORE_WASM=$lambdas/${lang#*:}.wasm psql "$url" -X -q -At <<SQL | awk '/^Time:/ {print $2}'
\\set wasm \`base64 -w0 "\$LAMBDASTORE_WASM"\`
\\timing on
SELECT lambdastore.deploy('${lang%%:*}count$n', decode(:'wasm', 'base64') || '$section'::bytea) IS NOT NULL;
SQL
)
    echo "${lang%%:*} $n $ms" >>"$work/deploy"
  done
done
psql "$url" -X -q <<'SQL'
CREATE TABLE ids (lang text, k int, id bigint, PRIMARY KEY (lang, k));
INSERT INTO ids SELECT 'rs', k, lambdastore.create_object('rscount1', 'Counter', '{}') FROM generate_series(1, 100) k;
INSERT INTO ids SELECT 'py', k, lambdastore.create_object('pycount1', 'Counter', '{}') FROM generate_series(1, 100) k;
SQL
for lang in rs py; do
  for method in get increment; do
    printf '\\set k random(1, 100)\nSELECT lambda_invoke((SELECT id FROM ids WHERE lang = %s AND k = :k), %s);\n' \
      "'$lang'" "'$method'" >"$work/$lang-$method.sql"
  done
done
echo 'SELECT 1;' >"$work/bare.sql"

# pgbench's tps and mean latency (ms).
run() {
  pgbench "$url" -n "$@" -T "$SECONDS_PER_RUN" 2>/dev/null \
    | awk '/^latency average/ {lat=$4} /^tps/ {tps=$3} END {printf "%.0f %.3f\n", tps, lat}'
}
: >"$work/runs"
for _ in $(seq "$ROUNDS"); do
  for clients in 1 8; do
    for lang in rs py; do
      for method in get increment; do
        echo "warm $clients $lang-$method $(run -M prepared -c "$clients" -j 2 -f "$work/$lang-$method.sql")" >>"$work/runs"
      done
    done
  done
  for preload in on off; do
    psql "$url" -X -q -c "ALTER SYSTEM SET lambdastore.preload_artifacts = $preload"
    "$cluster" stop benchpy && "$cluster" start benchpy >/dev/null
    for script in bare rs-get py-get; do
      echo "cold-$preload 1 $script $(run -C -c 1 -f "$work/$script.sql")" >>"$work/runs"
    done
  done
  psql "$url" -X -q -c "ALTER SYSTEM RESET lambdastore.preload_artifacts"
done

# Per instance: the extension's DEBUG2 lines for each call give the time to
# make its instance, to run the call in it (the guest and its host calls) and
# the largest its linear memory was (host/registry.rs), then the time to drop
# the store, which resets the memory for the next call (runtime/mod.rs); 50
# calls in one session after 20 unlogged ones.
for lang in rs py; do
  psql "$url" -X -q -v lang="$lang" 2>"$work/debug-$lang" >/dev/null <<'SQL'
SELECT count(lambda_invoke((SELECT id FROM ids WHERE lang = :'lang' AND k = 1 + g % 100), 'get')) FROM generate_series(1, 20) g;
SET client_min_messages = debug2;
SELECT count(lambda_invoke((SELECT id FROM ids WHERE lang = :'lang' AND k = 1 + g % 100), 'get')) FROM generate_series(1, 50) g;
SQL
  sed -n 's/.*made in \([0-9]*\) µs, ran in \([0-9]*\) µs, its linear memory \([0-9]*\) bytes.*/\1 \2 \3/p' "$work/debug-$lang" >"$work/instances-$lang"
  sed -n 's/.*a store dropped, its memory reset, in \([0-9]*\) µs.*/\1/p' "$work/debug-$lang" >"$work/resets-$lang"
  for kind in instances resets; do
    [ -s "$work/$kind-$lang" ] || { echo "no $kind lines at DEBUG2 for $lang: the extension no longer writes them?" >&2; exit 1; }
  done
done

. "$repo/scripts/bench-lib.sh"
# Column $4 (tx/s) or $5 (ms) of the runs of kind $1, clients $2, script $3,
# a round's per line; `of`, their median.
runs_of() { awk -v k="$1" -v c="$2" -v s="$3" -v col="$4" '$1 == k && $2 == c && $3 == s {print $col}' "$work/runs"; }
of() { runs_of "$@" | median; }

echo "| deploy | Rust counter | Python counter |"
echo "|---|---:|---:|"
echo "| module size | $(stat -c %s "$lambdas/counter.wasm") bytes | $(stat -c %s "$lambdas/py_counter.wasm") bytes |"
for n in 1 2 3; do
  case $n in
    1) label="first deploy (compile), ms" ;;
    2) label="the same bytes again (cached artifact), ms" ;;
    3) label="other bytes of the same code (compiled from the kept functions), ms" ;;
  esac
  echo "| $label | $(awk -v n="$n" '$1 == "rs" && $2 == n {print $3}' "$work/deploy") | $(awk -v n="$n" '$1 == "py" && $2 == n {print $3}' "$work/deploy") |"
done
echo
echo "| warm call (pgbench -M prepared) | Rust tx/s | Python tx/s | Rust ms | Python ms | Python ÷ Rust, in time |"
echo "|---|---:|---:|---:|---:|---:|"
for clients in 1 8; do
  for method in get increment; do
    rs_ms=$(of warm "$clients" "rs-$method" 5) py_ms=$(of warm "$clients" "py-$method" 5)
    ratios=$(round_ratios <(runs_of warm "$clients" "py-$method" 5) <(runs_of warm "$clients" "rs-$method" 5) 1)
    echo "| \`$method\`, $clients client(s) | $(of warm "$clients" "rs-$method" 4) | $(of warm "$clients" "py-$method" 4) | $rs_ms | $py_ms | $ratios |"
  done
done
echo
echo "| cold (pgbench -C, 1 client), ms | artifacts mapped by | connection + statement | the first call's share |"
echo "|---|---|---:|---:|"
for preload in on off; do
  by=$([ "$preload" = on ] && echo "the postmaster" || echo "each backend")
  bare=$(of "cold-$preload" 1 bare 5) rs=$(of "cold-$preload" 1 rs-get 5) py=$(of "cold-$preload" 1 py-get 5)
  echo "| \`SELECT 1\` | $by | $bare | — |"
  echo "| Rust \`get\` | $by | $rs | $(awk "BEGIN {printf \"%.2f\", $rs - $bare}") |"
  echo "| Python \`get\` | $by | $py | $(awk "BEGIN {printf \"%.2f\", $py - $bare}") |"
done
echo
echo "| per instance (a warm \`get\`, 50 calls) | Rust counter | Python counter |"
echo "|---|---:|---:|"
echo "| made in, µs (median) | $(cut -d' ' -f1 "$work/instances-rs" | median) | $(cut -d' ' -f1 "$work/instances-py" | median) |"
echo "| the call run in it (the guest and its host calls), µs (median) | $(cut -d' ' -f2 "$work/instances-rs" | median) | $(cut -d' ' -f2 "$work/instances-py" | median) |"
echo "| its memory reset as the store drops, µs (median) | $(median <"$work/resets-rs") | $(median <"$work/resets-py") |"
echo "| linear memory, bytes (largest) | $(cut -d' ' -f3 "$work/instances-rs" | sort -n | tail -1) | $(cut -d' ' -f3 "$work/instances-py" | sort -n | tail -1) |"
echo
echo "runs (kind, clients, script, tx/s, ms):"
cat "$work/runs"
