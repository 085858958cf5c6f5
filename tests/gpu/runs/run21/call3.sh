# Call 3: FP8 KV prefill on the tensor cores (helper-50) + everything: tests, attn_bench A/B, FP8 throughput.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; grep -E "build rc|error" $OUT/build_stdout.txt | head
source tests/gpu/runs/run21/env.sh
timeout 200 python3 -m pytest -q tests/gpu/test_gpu_kv_fp8.py > $OUT/pytest_kvfp8.txt 2>&1; tail -15 $OUT/pytest_kvfp8.txt
timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 fp8 > $OUT/attn_fp8.txt 2>&1; tail -4 $OUT/attn_fp8.txt
timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 > $OUT/attn_bf16.txt 2>&1; tail -4 $OUT/attn_bf16.txt
timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 256 --output 1024 --kv-cache-dtype fp8 > $OUT/throughput_fp8.txt 2>&1; grep "requests (" $OUT/throughput_fp8.txt
