# Session 54, call 1 for the next session (any GPU, ~300 s; from the repository root): after the
# padded FP8 product became what mixed serving steps run (PERF.md session 54), the whole FP8 GPU
# suite on c93d5be's single call site, then a trace of a 483-sequence FP8 decode step at 1,500
# tokens of context (483 = the H100 run's sequences in flight; not a multiple of 16, so padded):
# where the 30 ms of the H100's decode step go. Last, FP8 batch 1 (issue 15's bar: 85%).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== test_gpu_fp8.py (all)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
echo "== trace, FP8 block + FP8 KV, 483 x 1500"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 150 bash tests/gpu/trace_decode.sh $C8 0 1500 483 4 | head -24
echo "== FP8 batch 1"
timeout 90 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | tail -3
find $OUT -type f ! -name "trace_*.txt" -delete
