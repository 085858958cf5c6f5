# Session 49, call 3 (any one GPU; on an H200 issue 22's set, call1.sh, instead): k_t4_gemv reading x
# through L1 (default now) against staging it in shared memory (KAON_T4_X=smem): INT4 tests, the GEMV
# alone, W4A16 batch 1 alternating, the trace.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
if grep -q H200 /tmp/gpu.txt; then bash tests/gpu/runs/run32/call1.sh; exit 0; fi
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
for v in global smem; do echo "== GEMV alone, KAON_T4_X=$v"; KAON_T4_X=$v timeout 60 python3 -m pytest -q -s -p no:cacheprovider \
    tests/gpu/test_gpu_int4.py -k bandwidth 2>&1 | grep -E "INT4 GEMV" | grep -v "n=4"; done
CA=bench/configs/llama-3.1-8b-awq-g128.json
for r in 1 2; do for v in global smem; do echo -n "W4A16 x=$v: "; KAON_T4_X=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config $CA --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== trace, W4A16 (x through L1)"
OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $CA 0 64 1 16 | head -9
find $OUT -type f -delete
