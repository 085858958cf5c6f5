# Session 53, call 1 (any GPU, ~360 s; from the repository root): why issue 15's 3,000-request FP8
# run is ~3x slower per token than its 1,000-request run (session 53: 3,983 tok/s after 480 s against
# 11,592). kaon generate now splits step wall time into steps that computed prompt tokens and
# decode-only steps: the 3,000 run's progress line after 240 s.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== FP8 serving, 3000 x 1000/1000, fp8 KV, 240 s"
timeout 280 python3 bench/gpu_throughput.py --time-limit 240 --kaon build-gpu/kaon --config $C8 --kv-cache-dtype fp8 \
    --requests 3000 --prompt 1000 --output 1000 > /tmp/tp3000.txt 2>&1
grep -E "requests|PARTIAL|failed|last progress" /tmp/tp3000.txt | tail -3
find $OUT -type f -delete
