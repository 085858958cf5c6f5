# Session 58, call 3 (any GPU, ~450 s; from the repository root; carry .debs, .whl; a warm machine
# keeps build-gpu). FP8 batch 1: KAON_FP8_SILU_SPLIT (gate's and up's chunks streamed by half the
# warps each; the gate/up GEMV read at ~2.6 TB/s on the H100 where qkv and down reach ~2.9-3.0):
# its bit-equality test, the FP8 tests, an alternating A/B; then issue 15's serving-shape FP8 decode
# step traced where all 483 sequences decode (TRACE_TOKENS).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== FP8 tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
C8=bench/configs/llama-3.1-8b-fp8-block.json
for i in 1 2; do
    for v in 1 0; do
        echo -n "FP8 b1 split=$v: "
        KAON_FP8_SILU_SPLIT=$v timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode" | tail -1
    done
done
echo "== trace, FP8 block batch 1, split"
KAON_FP8_SILU_SPLIT=1 timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 2>&1 | sed -n 1,10p
echo "== trace, FP8 block weights, KV fp8, 483 x 1500 (all-decode steps)"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 200 bash tests/gpu/trace_decode.sh $C8 0 1500 483 4 | sed -n 1,24p
find $OUT -type f ! -name "trace_*.txt" -delete
