# Call 6 (session 45): batch-1 norm-in-GEMV and residual-add epilogue (KAON_GEMV_FUSE): tests
# (bit-exact vs the separate ops, models vs transformers), batch-1 decode A/B and trace, prefill 8k.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== tests"; timeout 200 python3 -m pytest -q tests/gpu/test_gpu.py -k "gemv_fuse or small_vs_transformers or real_size or tiny_model or test_linear" 2>&1 | tail -4
echo "== batch-1 decode, fused / separate / fused"
for e in 1 0 1; do KAON_GEMV_FUSE=$e timeout 100 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 --json $OUT/decode.jsonl 2>&1 | grep -E "^decode"; done
echo "== batch-1 trace"
OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -16
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/latency_prefill_8192.json 2>&1 | tail -2
find $OUT -type f ! -name "*.jsonl" ! -name "latency_prefill_8192.json" ! -name "trace_*.txt" -delete
