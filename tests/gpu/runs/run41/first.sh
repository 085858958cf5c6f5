# Session 57, first call (any GPU, ~480 s; from the repository root; carry .debs and .whl). llama.cpp
# is still building here, so this call measures what needs no llama.cpp. On an H200: issue 15's
# 3,000-request FP8 figure (run39/h200.sh, 300 s). On an H100: where a long-context FP8 decode step
# goes (483 x 1,500 tokens, FP8 KV against bf16 KV, the same weights): the 3,000 run's decode steps
# take ~29 ms against ~14 ms at a 17-token context. Then a bf16
# step at 64 x 1,536 (issue 22's 64 in flight).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    TP_LIMIT=300 bash tests/gpu/runs/run39/h200.sh
    exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
for kv in fp8 auto; do
    echo "== trace, FP8 block weights, KV $kv, 483 x 1500"
    TRACE_EXTRA="--kv-cache-dtype $kv" timeout 150 bash tests/gpu/trace_decode.sh $C8 0 1500 483 4 | head -22
done
# Issue 22's 64 in flight (1,024 / 1,024; 72.7% on the H200): a bf16 decode step at 64 x 1,536.
echo "== trace, bf16, 64 x 1536"
timeout 120 bash tests/gpu/trace_decode.sh bench/configs/meta-llama__Llama-3.1-8B-Instruct.json 0 1536 64 4 | head -22
find $OUT -type f ! -name "trace_*.txt" -delete
