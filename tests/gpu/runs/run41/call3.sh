# Session 57, call 3 (any GPU, ~500 s; from the repository root; carry .debs, .whl, .llama): the
# GGUF residual add and RMSNorm fused into the quantized GEMVs (KAON_QUANT_FUSE; the Q4_0 batch-1
# trace showed 65 one-block RMSNorm launches of ~2.9 us a token): its bit-equality test and the
# GGUF GPU tests, then a Q4_0 batch-1 A/B (fused vs KAON_QUANT_FUSE=0, alternating), then the
# batched traces with the step marker (KAON_TRACE_MARK): bf16 64 x 576, FP8 483 x 1,500 with FP8 KV.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== test_gpu.py: fused norm, quantized linears, GGUF logits, Q4_0 greedy"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py \
    -k "fused_norm or quant_linear or quant_gguf_logits or (quant_greedy and q4_0)" 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
echo "== Q4_0 (Q6_K output) batch 1: fused vs KAON_QUANT_FUSE=0, alternating"
for i in 1 2; do
    for f in 1 0; do
        echo -n "fuse=$f "
        KAON_QUANT_FUSE=$f timeout 60 python3 bench/gpu_decode_gguf.py --kaon build-gpu/kaon --qtype Q4_0 --out-qtype Q6_K \
            --keep /tmp/q40.gguf --tokens 128 2>&1 | grep "^decode" | tail -1
    done
done
echo "== trace, bf16, 64 x 576 (marked steps)"
timeout 100 bash tests/gpu/trace_decode.sh bench/configs/meta-llama__Llama-3.1-8B-Instruct.json 0 576 64 6 | sed -n 1,24p
echo "== trace, FP8 block weights, KV fp8, 483 x 1500 (marked steps)"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 220 bash tests/gpu/trace_decode.sh bench/configs/llama-3.1-8b-fp8-block.json 0 1500 483 4 | sed -n 1,26p
find $OUT -type f ! -name "trace_*.txt" -delete
