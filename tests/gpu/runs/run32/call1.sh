# Session 49, call 1 (H200 only, ~540 s): issue 22's H200 bars at HEAD (split norm + qkv RoPE fusion
# on by default) with a batch-1 A/B against KAON_NORM_SPLIT=0, and the FP8 norm-split test on fixed ids.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt; grep -q H200 /tmp/gpu.txt || exit 0
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
C=bench/configs/meta-llama__Llama-3.1-8B.json
for v in 1 0; do echo -n "bf16 split=$v: "; KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done
timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 | python3 -c "import sys,json; print('attn TFLOP/s', [(d['T'], d['p0'], d['TFLOPs']) for d in map(json.loads, sys.stdin)])"
echo "== prefill 8192"
timeout 90 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo "== 64 / 256 in flight, 1024 / 1024"
timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 2>&1 | grep -vi "info" | tail -4
O=$OUT
for c in 256 1024; do
    echo "== sweep $c"
    n=$((c > 512 ? c : 512))
    CONCURRENCY=$c NUM_PROMPTS=$n MAX_NUM_SEQS=$c OUT=$O/sweep$c timeout 150 bash bench/gpu_sweep.sh > $O/sweep$c.txt 2>&1
    grep -h '"kind": "serve_roofline"' $O/sweep$c.txt | tail -1
done
timeout 50 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k norm_split 2>&1 | grep -E "passed|failed|Error|assert" | tail -3
find $O -type f ! -name "serve-kaon-*.json" -delete
