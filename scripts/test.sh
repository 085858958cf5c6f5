#!/usr/bin/env bash
# Sets up (scripts/setup.sh --test) and runs every test: the C unit tests in a Release build and
# under AddressSanitizer + UndefinedBehaviorSanitizer, the reference tests (pytest against numpy,
# the gguf package, HF tokenizers, jinja2), and each libFuzzer target for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
jobs=$(nproc)
fuzz_seconds=${KAON_FUZZ_SECONDS:-60}

echo "== build (Release) and unit tests"
ninja -C build
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== unit tests under ASan + UBSan"
[ -f build-asan/build.ninja ] || cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKAON_SANITIZE=ON -DKAON_CUDA=OFF >/dev/null
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

echo "== reference tests (pytest: numpy, gguf, HF tokenizers, jinja2)"
KAON_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/ref

echo "== end-to-end tests (pytest + the openai client against a real kaon serve)"
KAON_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/e2e

echo "== benchmark tools (bench/serve.py metrics against a fake server, the dashboard in Chromium)"
KAON_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/bench

echo "== engine and model tests again on the ASan + UBSan build"
KAON_BUILD=$PWD/build-asan ASAN_OPTIONS=detect_leaks=1 .venv/bin/python -m pytest -q tests/ref/test_engine.py tests/ref/test_model_ref.py -k "not smollm2"

echo "== fuzzers (${fuzz_seconds}s each, ASan + UBSan)"
[ -f build-fuzz/build.ninja ] || CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAON_FUZZ=ON -DKAON_TESTS=OFF -DKAON_CUDA=OFF >/dev/null
ninja -C build-fuzz
for f in build-fuzz/fuzz/fuzz_*; do
  name=$(basename "$f")
  seeds=tests/fuzz/seeds/${name#fuzz_}
  corpus=$(mktemp -d)
  [ -d "$seeds" ] && cp -r "$seeds"/. "$corpus"/
  echo "-- $name"
  log=$(mktemp)
  if ! "$f" -max_total_time="$fuzz_seconds" -print_final_stats=1 "$corpus" >"$log" 2>&1; then
    tail -50 "$log"; echo "fuzzer $name failed" >&2; exit 1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+.*DONE" "$log" | tail -3
  rm -f "$log"
  rm -rf "$corpus"
done
echo "all tests passed"
