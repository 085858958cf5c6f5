# Call 3 (H200): issue 15's run: Llama-3.1-8B FP8 block, FP8 KV cache, 3,000 requests of 1,000/1,000 at once.
source tests/gpu/runs/run21/env.sh
export KAON_NINJA_JOBS=16; tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; grep "build rc" $OUT/build_stdout.txt
timeout 520 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --config bench/configs/llama-3.1-8b-fp8-block.json --kv-cache-dtype fp8 --requests 3000 --prompt 1000 --output 1000 --json $OUT/fp8_3000.json > $OUT/fp8_3000.txt 2>&1; tail -15 $OUT/fp8_3000.txt
