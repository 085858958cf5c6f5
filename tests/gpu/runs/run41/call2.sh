# Session 57, call 2 (any GPU, ~450-560 s; from the repository root; carry .debs, .whl, .llama).
# On an H200: issue 22's llama.cpp ratios (run40/vs_llama.sh, ~60 s after the build), then issue 15's
# 3,000-request FP8 figure (run39/h200.sh, 260 s). On an H100: the batched traces again with
# trace_decode.sh's fix (enough new tokens that every sequence decodes in the traced steps):
# FP8 483 x 1,500 with an FP8 cache (issue 15's serving shape) and bf16 64 x 576 (llama-batched-bench's
# shape: 512-token prompts + 128 new, issue 22's 1.8x bar).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    bash tests/gpu/runs/run40/vs_llama.sh
    TP_LIMIT=${TP_LIMIT:-260} bash tests/gpu/runs/run39/h200.sh
    exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
[ -x build-gpu/kaon ] || { tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1; }
source tests/gpu/runs/run21/env.sh
echo "== trace, bf16, 64 x 576"
timeout 120 bash tests/gpu/trace_decode.sh bench/configs/meta-llama__Llama-3.1-8B-Instruct.json 0 576 64 6 | head -24
echo "== trace, FP8 block weights, KV fp8, 483 x 1500"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 300 bash tests/gpu/trace_decode.sh bench/configs/llama-3.1-8b-fp8-block.json 0 1500 483 4 | head -24
find $OUT -type f ! -name "trace_*.txt" -delete
