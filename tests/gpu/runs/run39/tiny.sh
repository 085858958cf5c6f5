# Session 55, the last short call (any GPU, ~250 s): the padded and SiLU FP8 tests (the in-place
# gate/up products), then bench latency at batches 1, 448..451 (see call2.sh).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== test_gpu_fp8.py -k 'padded or silu'"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "padded or silu" 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
echo "== bench latency, FP8 block + FP8 KV, batches 1,448,449,450,451, 17 in / 8 out"
KAON_LOG=info timeout 80 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C8 --kv-cache-dtype fp8 \
    --batch-sizes 1,448,449,450,451 --input-len 17 --output-len 8 --num-iters 2 --num-iters-warmup 1 > /tmp/lat.txt 2>&1
echo "rc=$?"; tr '\r' '\n' < /tmp/lat.txt | grep -E "fp8|^ +batch|^ +[0-9]+ " | head -16
find $OUT -type f -delete
