# Session 58, call 2 (any GPU, ~450 s; from the repository root; carry .debs, .whl, .llama).
# Decode attention at a few tokens in one wave (KAON_DEC_ONE_WAVE): the tensor-core kernel holds one
# 132 KB block per SM, and its batch-1 grid (8 KV heads x 64 ranges) was ~4 waves, mostly empty
# ranges that each read the step's metadata and wait before they end. Tests, then batch-1 A/Bs
# (alternating): bf16 at a 32-token and an 8,000-token prompt, Q4_0; a Q4_0 batch-1 trace.
# On an H200 first: issue 22's llama.cpp ratios (run40/vs_llama.sh).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
grep -q H200 /tmp/gpu.txt && VS_LIMIT=200 bash tests/gpu/runs/run40/vs_llama.sh
echo "== decode attention tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_gpu_kv_fp8.py \
    -k "attention_decode_tc or attention_fp8_cache or tiny_model_fp8_cache" 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
C8=bench/configs/meta-llama__Llama-3.1-8B.json
for i in 1 2; do
    for w in 1 0; do
        echo -n "bf16 b1 p32 one_wave=$w: "
        KAON_DEC_ONE_WAVE=$w timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode" | tail -1
    done
done
for w in 1 0; do
    echo -n "bf16 b1 p8000 one_wave=$w: "
    KAON_DEC_ONE_WAVE=$w timeout 80 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --prompt-len 8000 --tokens 256 2>&1 | grep -E "^decode" | tail -1
done
for i in 1 2; do
    for w in 1 0; do
        echo -n "Q4_0 b1 one_wave=$w: "
        KAON_DEC_ONE_WAVE=$w timeout 70 python3 bench/gpu_decode_gguf.py --kaon build-gpu/kaon --qtype Q4_0 --out-qtype Q6_K \
            --keep /tmp/q40.gguf --tokens 128 2>&1 | grep "^decode" | tail -1
    done
done
echo "== trace, bf16 batch 1 (one wave)"
timeout 90 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 2>&1 | sed -n 1,12p
echo "== trace, Q4_0 batch 1 (one wave)"
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(32)))")
KAON_TRACE_OUT=/tmp/trace_q40.csv CUDA_INJECTION64_PATH=/tmp/libkaon_trace.so timeout 60 build-gpu/kaon run --device cuda \
    -m /tmp/q40.gguf --prompt-ids "$ids" -n 40 --temp 0 --ignore-eos --ctx-size 128 > $OUT/trace_q40.log 2>&1
python3 tests/gpu/trace_table.py /tmp/trace_q40.csv 32 | tee $OUT/trace_q40.txt | head -14
find $OUT -type f ! -name "trace_*.txt" -delete
