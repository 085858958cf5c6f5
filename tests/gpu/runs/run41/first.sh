# Session 57, first call (any GPU, ~500 s; from the repository root; carry .debs and .whl). llama.cpp
# is still building here, so this call measures what needs no llama.cpp. On an H200: issue 15's
# 3,000-request FP8 figure (run39/h200.sh, 300 s). On an H100, traces of where a step goes:
# Q4_0 GGUF batch 1 (issue 22's 2x llama.cpp bar: kaon ~450 tok/s = 47% of its roofline), a
# long-context FP8 decode step (483 x 1,500, FP8 KV: the 3,000 run's decode steps take ~29 ms
# against ~14 ms at a 17-token context), a bf16 step at 64 x 1,536 (issue 22's 64 in flight), and
# the FP8 step again with a bf16 KV cache.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    TP_LIMIT=300 bash tests/gpu/runs/run39/h200.sh
    exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
echo "== Q4_0 GGUF (Q6_K output) batch 1, then its trace"
timeout 120 python3 bench/gpu_decode_gguf.py --kaon build-gpu/kaon --qtype Q4_0 --out-qtype Q6_K --keep /tmp/q40.gguf \
    --tokens 128 2>&1 | grep -v "^{" | tail -3
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== trace, FP8 block weights, KV fp8, 483 x 1500"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 150 bash tests/gpu/trace_decode.sh $C8 0 1500 483 4 | head -22
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(32)))")
KAON_TRACE_OUT=/tmp/trace_q40.csv CUDA_INJECTION64_PATH=/tmp/libkaon_trace.so timeout 60 build-gpu/kaon run --device cuda \
    -m /tmp/q40.gguf --prompt-ids "$ids" -n 40 --temp 0 --ignore-eos --ctx-size 128 > $OUT/trace_q40.log 2>&1
echo "q4_0 trace rc=$?"
python3 tests/gpu/trace_table.py /tmp/trace_q40.csv 32 | tee $OUT/trace_q40.txt | head -26
echo "== trace, bf16, 64 x 1536"
timeout 100 bash tests/gpu/trace_decode.sh bench/configs/meta-llama__Llama-3.1-8B-Instruct.json 0 1536 64 4 | head -22
echo "== trace, FP8 block weights, KV auto (bf16), 483 x 1500"
TRACE_EXTRA="--kv-cache-dtype auto" timeout 120 bash tests/gpu/trace_decode.sh $C8 0 1500 483 4 | head -22
find $OUT -type f ! -name "trace_*.txt" -delete
