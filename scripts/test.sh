#!/usr/bin/env bash
# Sets up (scripts/setup.sh --test) and runs every test: the C unit tests in a Release build and
# under AddressSanitizer + UndefinedBehaviorSanitizer, the reference tests (pytest against numpy,
# the gguf package, HF tokenizers, jinja2), the end-to-end tests against a Release server and
# against an ASan + UBSan server, the unit tests and the concurrency-heavy end-to-end tests under
# ThreadSanitizer, and each libFuzzer target for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
jobs=$(nproc)
# 20 s per target keeps the whole CI under its 60-minute budget (14 targets); scripts/fuzz_long.sh runs
# them longer from the same seeds.
fuzz_seconds=${KAON_FUZZ_SECONDS:-20}

echo "== [$(date -u +%T)] build (Release) and unit tests"
ninja -C build
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== [$(date -u +%T)] libkaon.so.0's ABI against abi/libkaon.abi (abidiff)"
scripts/abi_check.sh

echo "== [$(date -u +%T)] unit tests under ASan + UBSan"
# -O1: the end-to-end tests below generate real tokens with this build; at -O0 they would crawl.
[ -f build-asan/build.ninja ] || cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DKAON_SANITIZE=ON -DKAON_CUDA=OFF >/dev/null
ninja -C build-asan
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$jobs"
# The communicator's ranks are threads that read each other's buffers: with fake stacks a rank
# reading another's stack after it returned (stop 38's CI failure) is caught every run, not only
# when the timing allows. (Not for every test: the chat template's depth guard measures the stack.)
ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 build-asan/tests/test_comm_cpu

echo "== [$(date -u +%T)] reference tests (pytest: numpy, gguf, HF tokenizers, jinja2)"
# --durations: the slowest tests, to keep CI under its 60-minute budget as the suite grows.
KAON_BUILD=$PWD/build .venv/bin/python -m pytest -q --durations=15 tests/ref

echo "== [$(date -u +%T)] end-to-end tests (pytest + the openai client against a real kaon serve)"
KAON_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/e2e

echo "== [$(date -u +%T)] Python package (pip install . in a fresh venv, then tests/python)"
KAON_BUILD=$PWD/build scripts/test_python.sh

echo "== [$(date -u +%T)] benchmark tools (bench/serve.py metrics against a fake server, the dashboard in Chromium)"
KAON_BUILD=$PWD/build .venv/bin/python -m pytest -q tests/bench

echo "== [$(date -u +%T)] engine and model tests again on the ASan + UBSan build"
KAON_BUILD=$PWD/build-asan ASAN_OPTIONS=detect_leaks=1 .venv/bin/python -m pytest -q tests/ref/test_engine.py tests/ref/test_model_ref.py -k "not smollm2"
KAON_BUILD=$PWD/build-asan ASAN_OPTIONS=detect_leaks=1 .venv/bin/python -m pytest -q tests/ref/test_spec_decode.py tests/ref/test_mtp_ref.py tests/ref/test_eagle3_ref.py -k "llama or sampling or bounds or mtp or eagle3"
KAON_BUILD=$PWD/build-asan ASAN_OPTIONS=detect_leaks=1 .venv/bin/python -m pytest -q tests/ref/test_tensor_parallel.py -k "not smollm2"
# Plugins: dlopen, the registry, a plugin's forward (its e2e test runs in the ASan e2e pass below).
KAON_BUILD=$PWD/build-asan ASAN_OPTIONS=detect_leaks=1 .venv/bin/python -m pytest -q tests/ref/test_plugin.py

echo "== [$(date -u +%T)] end-to-end tests against the ASan + UBSan server"
# Any sanitizer report in a server's output fails the test (tests/e2e/conftest.py), leaks included.
KAON_BUILD=$PWD/build-asan ASAN_OPTIONS=detect_leaks=1 .venv/bin/python -m pytest -q --durations=10 tests/e2e

echo "== [$(date -u +%T)] ThreadSanitizer: unit tests and the concurrency-heavy end-to-end tests"
# TSan watches the engine thread, the HTTP threads and their queues, and the kernels' thread
# pool (util/pool.c; test_pool drives it hard). scripts/tsan.supp lists only third-party false
# positives (none so far).
# test_drain_timeout_aborts_cleanly is timing-bound (aborted requests get the server's fixed 5 s
# grace) and a TSan build on a 2-core AVX2 machine needs seconds per decode step: it
# runs in the Release and ASan e2e passes above, not here.
[ -f build-tsan/build.ninja ] || cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKAON_TSAN=ON -DKAON_CUDA=OFF >/dev/null
ninja -C build-tsan
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
# Unit tests that start no thread are left out: TSan has nothing to watch in them (they run
# under ASan above); so is the MPI communicator's: Open MPI is not built for TSan, and its own
# locks (mca_pml_ob1, mca_btl_tcp) are reported from inside it on every run.
ctest --test-dir build-tsan --output-on-failure -j "$jobs" -E '^(test_grammar|test_sampler|test_chat_template|test_comm_mpi)$'
KAON_BUILD=$PWD/build-tsan .venv/bin/python -m pytest -q tests/e2e/test_concurrency.py tests/e2e/test_shutdown.py \
  tests/e2e/test_limits.py tests/e2e/test_bad_requests.py tests/e2e/test_openai_api.py \
  tests/e2e/test_anthropic_api.py \
  -k "(concurrency or shutdown or queue or timeout or disconnect or stream or n2 or metrics) and not drain_timeout_aborts"
# Tensor parallelism: rank worker threads, the CPU communicator, the engine thread's hand-off,
# and the abort of a step whose rank failed (the other ranks woken from their collective).
KAON_BUILD=$PWD/build-tsan .venv/bin/python -m pytest -q tests/ref/test_tensor_parallel.py tests/ref/test_tp_abort.py \
  -k "(llama or qwen3) and (prefill or batched) and not gguf and not smollm2 or abort"
unset TSAN_OPTIONS UBSAN_OPTIONS

echo "== [$(date -u +%T)] fuzzers (${fuzz_seconds}s each, ASan + UBSan, $jobs at a time)"
[ -f build-fuzz/build.ninja ] || CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAON_FUZZ=ON -DKAON_TESTS=OFF -DKAON_CUDA=OFF >/dev/null
ninja -C build-fuzz
# Each fuzzer is one thread: $jobs of them run side by side, each with a core and its full time.
fuzz_logs=$(mktemp -d)
run_fuzzer() {  # the fuzzer's binary: runs it from its seeds and dictionary; its log and exit status in $fuzz_logs
  local f=$1 name seeds corpus dict extra=()
  name=$(basename "$f")
  seeds=tests/fuzz/seeds/${name#fuzz_}
  corpus=$(mktemp -d)
  [ -d "$seeds" ] && cp -r "$seeds"/. "$corpus"/
  dict=tests/fuzz/dicts/${name#fuzz_}.dict
  [ -f "$dict" ] && extra+=(-dict="$dict")
  local rc=0
  "$f" -max_total_time="$fuzz_seconds" -timeout=60 -print_final_stats=1 "${extra[@]}" "$corpus" >"$fuzz_logs/$name.log" 2>&1 || rc=$?
  echo "$rc" > "$fuzz_logs/$name.rc"
  rm -rf "$corpus"
}
running=()
for f in build-fuzz/fuzz/fuzz_*; do
  run_fuzzer "$f" &
  running+=($!)
  if [ ${#running[@]} -ge "$jobs" ]; then wait "${running[0]}"; running=("${running[@]:1}"); fi
done
wait
for f in build-fuzz/fuzz/fuzz_*; do
  name=$(basename "$f")
  echo "-- $name"
  if [ "$(cat "$fuzz_logs/$name.rc" 2>/dev/null)" != 0 ]; then
    tail -50 "$fuzz_logs/$name.log"; echo "fuzzer $name failed" >&2; exit 1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+.*DONE" "$fuzz_logs/$name.log" | tail -3
done
rm -rf "$fuzz_logs"
echo "all tests passed [$(date -u +%T)]"
