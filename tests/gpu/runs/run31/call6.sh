# Session 48, call 6 (the warm H100, ~120 s): the refactored FP8 tests; FP8 block batch 1 with up's
# rows prefetched into L2 (KAON_FP8_UP_PREFETCH=1) against the default, alternating.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "model or norm_split" 2>&1 | grep -E "passed|failed|Error|assert" | tail -3
C8=bench/configs/llama-3.1-8b-fp8-block.json
for v in "X=1" "KAON_FP8_UP_PREFETCH=1" "X=1" "KAON_FP8_UP_PREFETCH=1"; do echo -n "fp8 $v: "; env $v timeout 40 \
    python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode"; done
find $OUT -type f -delete
