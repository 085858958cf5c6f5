# Call 5b (session 46, ~300 s of budget left): call 5 cut to the committed kernel's attn_bench and the
# prefill 8k bar; batch 1 too when the card is an H200. Figures to stdout.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
C=bench/configs/meta-llama__Llama-3.1-8B.json
timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 | python3 -c "import sys,json; print([(d['T'], d['p0'], d['TFLOPs']) for d in map(json.loads, sys.stdin)])"
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
case "$card" in *H200*)
    echo "== batch-1 decode"
    timeout 100 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode";;
esac
