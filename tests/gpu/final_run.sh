#!/usr/bin/env bash
# One GPU call: build, kernel tests, models vs transformers (small and real sizes), GGUF greedy
# GPU vs CPU, then the performance figures (tests/gpu/perf_run.sh).
cd "$(dirname "$0")/../.."
KAON_GPU_DEADLINE=${KAON_GPU_DEADLINE:-300} bash tests/gpu/run_all.sh build kernels models gguf big 2>&1 | tail -25
bash tests/gpu/perf_run.sh
