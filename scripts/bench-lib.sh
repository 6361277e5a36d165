# Shell helpers of the pgbench-driven benchmarks (bench-citus.sh,
# bench-python.sh, bench-standby.sh), sourced by them.

# The median of the numbers on stdin, one per line (the lower middle one
# of an even count).
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# Each round's ratio of the numbers in file $1 to those in file $2 (a
# round's on the same line of both), with $3 decimals, then their median:
# "median (rounds r1 · r2 · ...)". Within a round the two ran a minute apart
# at most, so its ratio is spared the machine's drift between rounds, which
# a ratio of two medians, each perhaps from another round, is not.
round_ratios() {
  local ratios
  ratios=$(paste -d' ' "$1" "$2" | awk -v d="$3" '{printf "%." d "f\n", $1 / $2}')
  echo "$(median <<<"$ratios") (rounds $(paste -sd' ' <<<"$ratios" | sed 's/ / · /g'))"
}

# CPU ticks (1/100 s) a server has spent: its postmaster, the children it
# reaped, and the live ones. $1 is its data directory.
cpu_ticks() {
  local pm t s
  pm=$(head -n 1 "$1/postmaster.pid")
  read -r -a s <"/proc/$pm/stat"; t=$((s[13] + s[14] + s[15] + s[16]))
  for c in $(pgrep -P "$pm"); do read -r -a s <"/proc/$c/stat" 2>/dev/null && t=$((t + s[13] + s[14])); done
  echo "$t"
}
