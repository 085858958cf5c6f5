#!/usr/bin/env bash
# Long local fuzz runs (issue 9): each libFuzzer target for $1 seconds (default 600) from the seed
# corpora, one after another, ASan + UBSan. Prints and saves per target: executions, edge coverage
# (cov), features (ft), corpus size, and whether it crashed. Not run by CI (CI runs 60 s each).
#   scripts/fuzz_long.sh [seconds] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}; shift || true
build=${KAON_FUZZ_BUILD:-build-fuzz}
[ -f "$build/build.ninja" ] || CC=clang cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKAON_FUZZ=ON -DKAON_TESTS=OFF -DKAON_CUDA=OFF >/dev/null
ninja -C "$build" >/dev/null
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(ls "$build"/fuzz/ | grep '^fuzz_'))
mkdir -p bench/results
out=bench/results/fuzz-$(date -u +%Y%m%dT%H%M%SZ).txt
{
  echo "# fuzz_long.sh $seconds s per target; commit $(git rev-parse --short HEAD); $(date -u +%FT%TZ)"
  echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  printf "%-22s %8s %12s %8s %8s %8s %s\n" target seconds executions cov ft corpus result
} | tee "$out"
status=0
for name in "${targets[@]}"; do
  f=$build/fuzz/$name
  short=${name#fuzz_}
  corpus=$(mktemp -d)
  [ -d "tests/fuzz/seeds/$short" ] && cp -r "tests/fuzz/seeds/$short"/. "$corpus"/
  extra=()
  [ -f "tests/fuzz/dicts/$short.dict" ] && extra+=(-dict="tests/fuzz/dicts/$short.dict")
  log=$(mktemp)
  result=ok
  "$f" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$corpus/" "${extra[@]}" "$corpus" \
    >"$log" 2>&1 || { result=CRASH; status=1; }
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last"); ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  printf "%-22s %8s %12s %8s %8s %8s %s\n" "$name" "$seconds" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result" | tee -a "$out"
  if [ $result != ok ]; then tail -40 "$log"; cp "$log" "$out.$name.log"; fi
  rm -f "$log"; rm -rf "$corpus"
done
echo "saved $out"
exit $status
