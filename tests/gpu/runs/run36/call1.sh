# Session 52, call 1 (any GPU, ~500 s; run from the repository root so a warm machine keeps the
# build): why issue 15's FP8 serving run is slow. A trace of batched decode steps in its shape
# (448 sequences at ~1,500 tokens of context, FP8 KV), then the 1,000-request run with the
# admission default against KAON_ADMIT_RATIO=0, each stopped after 120 s with its figure so far.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== INT4 layer checks (session 52's kaon_linear_is_int4_scaled), default and compact form"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "sz16 or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
echo "== trace, FP8 block + FP8 KV, 448 x 1500"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 150 bash tests/gpu/trace_decode.sh $C8 0 1500 448 4 | head -16
for v in adaptive 0; do echo "== FP8 serving, 1000 x 1000/1000, fp8 KV, KAON_ADMIT_RATIO=$v"
    KAON_ADMIT_RATIO=$v timeout 150 python3 bench/gpu_throughput.py --time-limit 120 --kaon build-gpu/kaon --config $C8 \
        --kv-cache-dtype fp8 --requests 1000 --prompt 1000 --output 1000 > /tmp/tp_$v.txt 2>&1
    grep -E "requests \(|PARTIAL|failed" /tmp/tp_$v.txt | tail -2
    grep -o '"steps\\": [0-9]*, \\"preemptions\\": [0-9]*\|prompt_tokens_computed\\": [0-9]*' /tmp/tp_$v.txt | head -2
done
find $OUT -type f ! -name "trace_*.txt" -delete
