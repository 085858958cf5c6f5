# Session 58, call 4 (any GPU, ~200 s; from the repository root; carry .debs, .whl, .snap). k_qact_norm
# (GGUF RMSNorm + int8 activations, one block a row) keeps each thread's x group in registers between
# its two passes and reads its norm weights before the PDL wait (bit-equal; "alt" = 6391a87's
# cuda_quant.cu from .snap/alt/, built in the same call): the fused-norm tests, Q4_0 batch 1
# alternating x3, the Q4_0 batch-1 trace; then the decode-attention kernel alone: KAON_DEC_TC_FP8_STAGES=3/2
# (the FP8 path's stages a warp: more blocks a SM; the 483 x 1,500 serving step is 61% this kernel at
# 2.43 TB/s on the H100), its tests and dec_bench; ncu_dec.sh.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
cp build-gpu/kaon /tmp/kaon-head
f=src/backend/cuda/cuda_quant.cu
cp $f /tmp/head_quant.cu && cp .snap/alt/cuda_quant.cu $f && ninja -C build-gpu kaon > /tmp/alt_build.txt 2>&1 \
    && cp build-gpu/kaon /tmp/kaon-alt; echo "alt build rc=$?"; cp /tmp/head_quant.cu $f; touch $f
echo "== fused-norm tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py -k "fused_norm_bit_equal" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
Q="bench/gpu_decode_gguf.py --qtype Q4_0 --out-qtype Q6_K --keep /tmp/q40.gguf --tokens 128"
for i in 1 2 3; do
    for v in head alt; do
        echo -n "Q4_0 b1 $v: "; timeout 60 python3 $Q --kaon /tmp/kaon-$v 2>&1 | grep "^decode" | tail -1
    done
done
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(32)))")
KAON_TRACE_OUT=/tmp/trace_q40.csv CUDA_INJECTION64_PATH=/tmp/libkaon_trace.so timeout 60 /tmp/kaon-head run --device cuda \
    -m /tmp/q40.gguf --prompt-ids "$ids" -n 40 --temp 0 --ignore-eos --ctx-size 128 > $OUT/trace_q40.log 2>&1
python3 tests/gpu/trace_table.py /tmp/trace_q40.csv 32 | tee $OUT/trace_q40.txt | head -10
echo "== FP8-cache attention tests with 3 and 2 stages a warp (KAON_DEC_TC_FP8_STAGES)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_kv_fp8.py -k "attention_fp8_cache and (st3 or st2)" 2>&1 \
    | grep -E "passed|failed|Error|assert" | tail -4
echo "== decode attention alone (gpu_driver dec_bench, FP8 cache; stages 4 / 3 / 2), then ncu of B256 x 1.5K and B1 x 64"
for st in 4 3 2; do
    echo "stages $st"; KAON_DEC_TC_FP8_STAGES=$st timeout 40 build-gpu/gpu_driver dec_bench 32 8 128 fp8 2>&1 | grep timing | cut -c1-150
done
timeout 60 bash tests/gpu/ncu_dec.sh 7 fp8 2>&1 | tail -9
timeout 120 bash tests/gpu/ncu_dec.sh 9 bf16 sass 2>&1 | tail -42
find $OUT -type f ! -name "trace_*.txt" -delete
