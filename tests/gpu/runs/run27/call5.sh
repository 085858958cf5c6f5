# Call 5 (session 46): the wgmma prefill kernel as committed (one instance, SASS-identical to call
# 1's lean instance): its attn_bench figures and the prefill 8k bar; then batch 1, 64 / 256 in
# flight on whichever card comes. Figures to stdout.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
timeout 100 python3 -m pytest -q tests/gpu/test_gpu.py -k "test_attention_prefill and wgmma" 2>&1 | tail -1
timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 | python3 -c "import sys,json; print([(d['T'], d['p0'], d['TFLOPs']) for d in map(json.loads, sys.stdin)])"
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo "== batch-1 decode"
timeout 100 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"
echo "== 64 / 256 in flight, 1024 / 1024"
timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 2>&1 | grep -vi "info" | tail -4
