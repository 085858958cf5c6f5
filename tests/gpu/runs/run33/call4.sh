# Session 50, call 4 (any GPU, ~500 s): issue 15's serving run on whatever GPU comes (the bar is the
# H200's): Llama-3.1-8B FP8 block, FP8 KV cache, 3,000 requests of 1,000 / 1,000 tokens at once.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
timeout 420 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --config bench/configs/llama-3.1-8b-fp8-block.json \
    --kv-cache-dtype fp8 --requests 3000 --prompt 1000 --output 1000 > /tmp/fp8_3000.txt 2>&1; echo "rc=$?"; tail -c 3000 /tmp/fp8_3000.txt
find $OUT -type f -delete
