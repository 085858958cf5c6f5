# Session 49, call 6 (any one GPU, ~150 s): HEAD after the revert: the FP8 split-norm test on its
# fixed ids (owed since session 48), the INT4 split / model tests, W4A16 batch 1 once.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k norm_split 2>&1 | grep -E "passed|failed|Error|assert" | tail -3
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "norm_split or model" 2>&1 | grep -E "passed|failed|Error|assert" | tail -3
R=${KAON_GPU_RESULTS:-/tmp/kaon_gpu_results}; grep -h '"fp8_norm_split"\|"int4_norm_split"' $R/results.jsonl 2>/dev/null | cut -c1-300 | head -4
echo -n "W4A16: "; timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config bench/configs/llama-3.1-8b-awq-g128.json \
    --tokens 256 2>&1 | grep -E "^decode"
find $OUT -type f -delete
