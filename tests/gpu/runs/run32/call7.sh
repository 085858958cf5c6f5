# Session 49, call 7 (any one GPU, <= 150 s): k_t4_gemv refilling q[u] after consuming it in place
# (HEAD's SASS moved each refill back within its own step, waiting on it: ~1 load in flight per
# warp); W4A16 batch 1 (calls 3-6 on H100: 349-359 tok/s), INT4 tests, batch 1 again.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json
echo -n "W4A16: "; timeout 25 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $CA --tokens 256 2>&1 | grep -E "^decode" | tee $OUT/w4.txt
timeout 45 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "model or norm_split or fused" 2>&1 | grep -E "passed|failed|Error|assert" | tail -3 | tee $OUT/tests.txt
echo -n "W4A16: "; timeout 25 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $CA --tokens 256 2>&1 | grep -E "^decode"
