# Session 55 on an H200 (~560 s; from the repository root): the padded FP8 tests (the new in-place
# gate/up among them), then issue 15's 3,000-request FP8 figure (bar 18,000 output tok/s), 380 s
# at most; the last progress line has the step split.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== test_gpu_fp8.py -k padded"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "padded" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
echo "== FP8 serving, 3000 x 1000/1000, fp8 KV, ${TP_LIMIT:-380} s"
timeout $((${TP_LIMIT:-380} + 40)) python3 bench/gpu_throughput.py --time-limit ${TP_LIMIT:-380} --kaon build-gpu/kaon --config $C8 --kv-cache-dtype fp8 \
    --requests 3000 --prompt 1000 --output 1000 > /tmp/tp3000.txt 2>&1
grep -E "requests|PARTIAL|failed|last progress|warn|info" /tmp/tp3000.txt | tail -14
find $OUT -type f -delete
