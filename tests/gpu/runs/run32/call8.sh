# Session 49's opt-in FP8 kernel, for the next session (any one GPU, ~200 s; worth more on an H200):
# KAON_FP8_SILU_MIX=1 (gate's and up's chunks in one cp.async ring): its bit-equality test, the FP8
# tests, FP8 block batch 1 default / mixed alternating twice, and the trace of the mixed run.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
C8=bench/configs/llama-3.1-8b-fp8-block.json
for r in 1 2; do for v in 0 1; do echo -n "FP8 mix=$v: "; KAON_FP8_SILU_MIX=$v timeout 40 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== trace, FP8 mixed"
KAON_FP8_SILU_MIX=1 OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -9
find $OUT -type f -delete
