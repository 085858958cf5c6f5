# Session 50, call 3 (any GPU, ~150 s): the INT4 GEMV's run-time knobs again after the refill fix (all
# three were slower before it, session 49): KAON_T4_NW=4 / 8 forced, KAON_T4_X=global (x through L1 at
# batch 1 too), alternating with the default, two rounds.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json
for r in 1 2; do for v in "" KAON_T4_NW=8 KAON_T4_NW=4 KAON_T4_X=global; do echo -n "W4A16 ${v:-default}: "
    env $v timeout 30 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $CA --tokens 256 2>&1 | grep -E "^decode"; done; done
find $OUT -type f -delete
