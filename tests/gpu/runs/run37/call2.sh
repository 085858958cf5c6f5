# Session 53, call 2 (any GPU, ~300 s; from the repository root): whether FP8 batches of more than
# 64 tokens fall back to the GEMV (cuda_fp8.cu warns, naming the shape, when cuBLASLt gives no
# algorithm; with KAON_FP8_PAD=1, the default, such shapes run padded to a multiple of 16 and an
# info line says so). The padded path's test, bench latency at batches 449..451 (decode n = 449..451,
# prefill n = 17 x those) without padding and with it, then the 3,000-request run's step split.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== padded FP8 products (KAON_FP8_PAD=force) against the CPU"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "padded" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for pad in 0 1; do echo "== bench latency, FP8 block + FP8 KV, KAON_FP8_PAD=$pad, batches 1,448,449,450,451, 17 in / 8 out"
    KAON_LOG=info KAON_FP8_PAD=$pad timeout 80 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C8 --kv-cache-dtype fp8 \
        --batch-sizes 1,448,449,450,451 --input-len 17 --output-len 8 --num-iters 2 --num-iters-warmup 1 > /tmp/lat$pad.txt 2>&1
    echo "rc=$?"; tr '\r' '\n' < /tmp/lat$pad.txt | grep -E "fp8|^ +batch|^ +[0-9]+ " | head -16
done
echo "== FP8 serving, 3000 x 1000/1000, fp8 KV, 90 s"
timeout 120 python3 bench/gpu_throughput.py --time-limit 90 --kaon build-gpu/kaon --config $C8 --kv-cache-dtype fp8 \
    --requests 3000 --prompt 1000 --output 1000 > /tmp/tp3000.txt 2>&1
grep -E "requests|PARTIAL|failed|last progress|warn" /tmp/tp3000.txt | tail -12
find $OUT -type f -delete
