#!/usr/bin/env bash
# The steps of .github/workflows/lockstep.yml on one machine: build, run the matrix as N shards side by
# side (each its own process, as each CI job is its own runner), merge their reports, publish the site,
# gate the merged report with JUnit output. Usage:
#
#   ci/shard-local.sh N [lockstep run filters...]     e.g.  ci/shard-local.sh 3 --model synth-llama --model synth-qwen2
#
# Outputs go to $OUT (default target/shard-local/): shards/<run id>/, merged/<run id>/, site/, junit.xml,
# shard-<i>.log. Each shard gets cores/N threads (at least 1) so the shards do not oversubscribe the machine.
# Exit status: the gate's (0 pass, 1 failing cells), 2 on an error of any step.
set -euo pipefail
cd "$(dirname "$0")/.."

n="${1:?usage: ci/shard-local.sh N [lockstep run filters...]}"
shift
case "$n" in (*[!0-9]*|'') echo "N must be a positive integer, not $n" >&2; exit 2;; esac
[ "$n" -ge 1 ] || { echo "N must be at least 1" >&2; exit 2; }

out="${OUT:-target/shard-local}"
rm -rf "$out"
mkdir -p "$out/shards"

cargo build --quiet --release -p lockstep
bin=target/release/lockstep
cores="$(nproc)"
threads=$(( cores / n ))
[ "$threads" -ge 1 ] || threads=1

start=$(date +%s%N)
pids=()
for i in $(seq 1 "$n"); do
  "$bin" --threads "$threads" run --shard "$i/$n" --reports "$out/shards" \
    --junit "$out/junit-shard-$i.xml" "$@" >"$out/shard-$i.log" 2>&1 &
  pids+=("$!")
done
status=0
for i in $(seq 1 "$n"); do
  if wait "${pids[$((i - 1))]}"; then s=0; else s=$?; fi
  echo "shard $i/$n: exit $s ($(tail -n 1 "$out/shard-$i.log"))"
  # 1 = failing cells (the gate below decides); anything else is an error
  if [ "$s" -gt 1 ]; then status=2; fi
done
end=$(date +%s%N)
awk -v ns="$((end - start))" -v n="$n" -v t="$threads" -v c="$cores" \
  'BEGIN { printf "shards side by side: %.1f s wall (%d shards x %d threads on %d cores)\n", ns / 1e9, n, t, c }'
[ "$status" -eq 0 ] || { echo "a shard failed with an error: see $out/shard-*.log" >&2; exit 2; }

"$bin" merge "$out"/shards/*/report.json --reports "$out/merged"
"$bin" publish "$out/merged" --out "$out/site"
"$bin" gate "$out"/merged/*/report.json --junit "$out/junit.xml"
