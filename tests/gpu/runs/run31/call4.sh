# Session 48, call 4 (any one GPU, ~200 s): the FP8 split norm with the residual's old value loaded
# right after the wait and the parts summed with 8 loads in flight per lane; INT4 split tests.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
R=${KAON_GPU_RESULTS:-/tmp/kaon_gpu_results}
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "model or linear_multi" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "norm_split" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
grep -h '"fp8_norm_split"\|"int4_norm_split"' $R/results.jsonl 2>/dev/null | cut -c1-300 | head -3
C8=bench/configs/llama-3.1-8b-fp8-block.json
for r in 1 2; do for v in 1 0; do echo -n "fp8 split=$v: "; KAON_NORM_SPLIT_QUANT=1 KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode"; done; done
KAON_NORM_SPLIT_QUANT=1 OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -12
find $OUT -type f -delete
