# Call 1 (session 45): the default build with the wgmma prefill and the FP8 fragments decode path,
# both on since 06c3251: tests, then the perf set (bench latency prefill 1k/8k, batch 1, 64/256 in
# flight), then FP8 cache 256 in flight. Figures to stdout (the device returns ~8 files at most).
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== kvfp8"; timeout 150 python3 -m pytest -q --maxfail=30 tests/gpu/test_gpu_kv_fp8.py 2>&1 | tail -2
echo "== attention + model"; timeout 150 python3 -m pytest -q -x tests/gpu/test_gpu.py -k "attention or small_vs_transformers or tiny_model" 2>&1 | tail -2
echo "== perf"; OUT=$OUT bash tests/gpu/perf_run.sh 2>&1 | grep -v "^kaon info"
echo "== fp8 256"; timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 256 --output 1024 --kv-cache-dtype fp8 2>&1 | grep "requests ("
