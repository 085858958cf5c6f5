# Call 1: build, attention + model tests, batch-1 decode, 64/256 in flight (1024/1024).
set -x
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; tail -3 $OUT/build_stdout.txt
source tests/gpu/runs/run21/env.sh
timeout 200 python3 -m pytest -q -x tests/gpu/test_gpu.py tests/gpu/test_gpu_kv_fp8.py -k "attention or small_vs_transformers or tiny_model" > $OUT/pytest.txt 2>&1; tail -5 $OUT/pytest.txt
timeout 120 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config bench/configs/meta-llama__Llama-3.1-8B.json > $OUT/decode.txt 2>&1; tail -6 $OUT/decode.txt
timeout 200 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 > $OUT/throughput.txt 2>&1; grep "requests (" $OUT/throughput.txt
OUT=$OUT timeout 90 bash tests/gpu/trace_decode.sh bench/configs/meta-llama__Llama-3.1-8B.json 0 64 1 16 > $OUT/trace_b1.txt 2>&1; tail -45 $OUT/trace_b1.txt
