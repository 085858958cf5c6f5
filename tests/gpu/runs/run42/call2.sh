# Session 58, call 2 (any GPU, ~500 s; from the repository root; carry .debs, .whl, .llama, .snap).
# Decode attention at a few tokens: (1) the grid in one wave (KAON_DEC_ONE_WAVE; the tensor-core
# kernel holds one 132 KB block per SM, and its batch-1 grid of 8 KV heads x 64 ranges was ~4 waves,
# mostly empty ranges that each read the step's metadata and wait before ending); (2) the first
# tiles' slots looked up before the PDL wait and their K/V copies issued before Q is read ("alt" is
# the kernel without (2), .snap/alt/, built in the same call). Tests, then batch-1 A/Bs
# (alternating): bf16 at a 32- and an 8,000-token prompt, Q4_0; bf16 and Q4_0 batch-1 traces.
# Also (3): GGUF q / k / v GEMV with RoPE and the KV write in its epilogue (KAON_QKV_ROPE=0: apart),
# its bit-equality test (test_quant_fused_norm_bit_equal) and a Q4_0 A/B.
# On an H200 first: issue 22's llama.cpp ratios (run40/vs_llama.sh).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
cp build-gpu/kaon /tmp/kaon-head
f=src/backend/cuda/cuda_attention_decode_tc.cu
cp $f /tmp/head_tc.cu && cp .snap/alt/cuda_attention_decode_tc.cu $f && ninja -C build-gpu kaon > /tmp/alt_build.txt 2>&1 \
    && cp build-gpu/kaon /tmp/kaon-alt; echo "alt build rc=$?"; cp /tmp/head_tc.cu $f
grep -q H200 /tmp/gpu.txt && VS_LIMIT=200 bash tests/gpu/runs/run40/vs_llama.sh
echo "== decode attention tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_gpu_kv_fp8.py \
    -k "attention_decode_tc or attention_fp8_cache or tiny_model_fp8_cache or fused_norm_bit_equal" 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
C8=bench/configs/meta-llama__Llama-3.1-8B.json
run() {  # label, env, binary, args...
    local l=$1 e=$2 k=$3; shift 3
    echo -n "$l: "; env $e timeout 80 python3 "$@" --kaon $k 2>&1 | grep -E "^decode" | tail -1
}
for i in 1 2; do
    run "bf16 b1 p32 head" KAON_DEC_ONE_WAVE=1 /tmp/kaon-head bench/gpu_decode.py --config $C8 --tokens 256
    run "bf16 b1 p32 four-waves" KAON_DEC_ONE_WAVE=0 /tmp/kaon-head bench/gpu_decode.py --config $C8 --tokens 256
    run "bf16 b1 p32 alt" KAON_DEC_ONE_WAVE=1 /tmp/kaon-alt bench/gpu_decode.py --config $C8 --tokens 256
done
run "bf16 b1 p8000 head" KAON_DEC_ONE_WAVE=1 /tmp/kaon-head bench/gpu_decode.py --config $C8 --prompt-len 8000 --tokens 256
run "bf16 b1 p8000 four-waves" KAON_DEC_ONE_WAVE=0 /tmp/kaon-head bench/gpu_decode.py --config $C8 --prompt-len 8000 --tokens 256
Q="bench/gpu_decode_gguf.py --qtype Q4_0 --out-qtype Q6_K --keep /tmp/q40.gguf --tokens 128"
run "Q4_0 b1 head" KAON_DEC_ONE_WAVE=1 /tmp/kaon-head $Q
run "Q4_0 b1 qkv-rope-off" KAON_QKV_ROPE=0 /tmp/kaon-head $Q
run "Q4_0 b1 four-waves" KAON_DEC_ONE_WAVE=0 /tmp/kaon-head $Q
run "Q4_0 b1 alt" KAON_DEC_ONE_WAVE=1 /tmp/kaon-alt $Q
run "Q4_0 b1 head" KAON_DEC_ONE_WAVE=1 /tmp/kaon-head $Q
run "Q4_0 b1 qkv-rope-off" KAON_QKV_ROPE=0 /tmp/kaon-head $Q
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
echo "== trace, Q4_0 batch 1 (head)"
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(32)))")
KAON_TRACE_OUT=/tmp/trace_q40.csv CUDA_INJECTION64_PATH=/tmp/libkaon_trace.so timeout 60 build-gpu/kaon run --device cuda \
    -m /tmp/q40.gguf --prompt-ids "$ids" -n 40 --temp 0 --ignore-eos --ctx-size 128 > $OUT/trace_q40.log 2>&1
python3 tests/gpu/trace_table.py /tmp/trace_q40.csv 32 | tee $OUT/trace_q40.txt | head -14
find $OUT -type f ! -name "trace_*.txt" -delete
