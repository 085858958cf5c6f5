# Call 5 (session 45): the whole perf set (tests/gpu/perf_run.sh) at this commit, and the FP8
# cache at 256 in flight, for docs/PERF.md. Figures to stdout.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== perf"; OUT=$OUT bash tests/gpu/perf_run.sh 2>&1 | grep -v "^kaon info"
echo "== fp8 256"; timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 256 --output 1024 --kv-cache-dtype fp8 2>&1 | grep "requests ("
