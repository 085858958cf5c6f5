# Session 51, call 3 (any GPU, ~160 s): call 1's KAON_T4_SZ16 check (its tests, a W4A16 batch-1 A/B);
# KAON_FP8_QX in its one-round-trip form (3cab79e): its bit-equality test and a batch-1 A/B.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "sz16 or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2; do for v in 0 1; do echo -n "W4A16 sz16=$v: "; KAON_T4_SZ16=$v timeout 30 python3 bench/gpu_decode.py \
    --config $CA --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
C8=bench/configs/llama-3.1-8b-fp8-block.json
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "qx or mix" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2; do for v in 0 1; do echo -n "FP8 qx=$v: "; KAON_FP8_QX=$v timeout 30 python3 bench/gpu_decode.py \
    --config $C8 --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
find $OUT -type f -delete
