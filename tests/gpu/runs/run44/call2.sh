# Session 60, call 2 (any GPU; ~420 s; from the repository root; carry .debs, .whl; after call 1 on a
# warm machine the build is there). (1) Qwen3's q / k head norms inside the RoPE + KV-write kernel
# (qk_norm_rope_kv_write, session 59, never run): its bit-equality test, then Qwen3-8B and
# Qwen3-30B-A3B batch 1 against KAON_QK_NORM_FUSE=0, alternating; (2) Qwen3-30B-A3B's batch-1 kernel
# map now (issue 16; the last one is session 30's run10).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== qk-norm fusion tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py -k "qk_norm_fused or norm_split_vs_transformers and qwen3" 2>&1 \
    | grep -E "passed|failed|Error|assert" | tail -6
for c in Qwen__Qwen3-8B Qwen__Qwen3-30B-A3B; do
    for i in 1 $([ $c = Qwen__Qwen3-8B ] && echo 2); do
        for e in 1 0; do
            echo -n "$c b1 fuse=$e: "; KAON_QK_NORM_FUSE=$e timeout 100 python3 bench/gpu_decode.py --config bench/configs/$c.json \
                --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1
        done
    done
done
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
echo "== trace, Qwen3-30B-A3B batch 1"
timeout 150 bash tests/gpu/trace_decode.sh bench/configs/Qwen__Qwen3-30B-A3B.json 0 32 1 16 | head -24
find $OUT -type f ! -name "trace_*.txt" -delete
