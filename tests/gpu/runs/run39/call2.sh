# Session 55, call 2 (any GPU, ~420 s; from the repository root): the padded FP8 product now writes
# gate and up straight into their scratch (no copy back). The whole FP8 suite (the new
# test_fp8_silu_padded among it), bench latency at batches 1, 448..451 (448 runs unpadded: the
# 449..451 steps' excess over it is the padding's cost; session 54 on an H100: 13.8 vs 15.1 / 14.8 /
# 14.8 ms), then FP8 batch 1 (issue 15's bar: 85%).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== test_gpu_fp8.py ${FP8_K:-(all)}"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py ${FP8_K:+-k "$FP8_K"} 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
echo "== bench latency, FP8 block + FP8 KV, batches 1,448,449,450,451, 17 in / 8 out"
KAON_LOG=info timeout 80 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C8 --kv-cache-dtype fp8 \
    --batch-sizes 1,448,449,450,451 --input-len 17 --output-len 8 --num-iters 2 --num-iters-warmup 1 > /tmp/lat.txt 2>&1
echo "rc=$?"; tr '\r' '\n' < /tmp/lat.txt | grep -E "fp8|^ +batch|^ +[0-9]+ " | head -16
echo "== FP8 batch 1"
timeout 90 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | tail -3
find $OUT -type f -delete
