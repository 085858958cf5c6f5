# Session 51, call 1 (any GPU, ~200 s): KAON_T4_SZ16 after the device-copy check fix (its tests
# failed in run34 call 1: "bad INT4 layer"), W4A16 batch-1 A/B; the FP8 tests after QX's removal.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2 3; do for v in 0 1; do echo -n "W4A16 sz16=$v: "; KAON_T4_SZ16=$v timeout 40 python3 bench/gpu_decode.py \
    --config $CA --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== trace, W4A16, SZ16"; KAON_T4_SZ16=1 timeout 60 bash tests/gpu/trace_decode.sh $CA 0 64 1 16 | head -9
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "mix or norm_split or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
find $OUT -type f -delete
