# Session 49, call 4 (any one GPU): x staged at one row, read through L1 at more (auto); INT4 tests;
# W4A16 batch 1 with 4- / 8-warp blocks forced (KAON_T4_NW); why the INT4 GEMVs read at ~2.2 TB/s
# where bf16's read at ~3.2 (H100): ncu stall reasons, occupancy, DRAM throughput of both.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
CA=bench/configs/llama-3.1-8b-awq-g128.json
for v in auto 8 4; do echo -n "W4A16 NW=$v: "; KAON_T4_NW=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config $CA --tokens 256 2>&1 | grep -E "^decode"; done
echo "== ncu, W4A16 (2 layers)"
OUT=$OUT timeout 150 bash tests/gpu/ncu_stalls.sh $CA 2 "k_t4_gemv" 4 2>&1 | tail -40
echo "== ncu, bf16 (2 layers)"
OUT=$OUT timeout 120 bash tests/gpu/ncu_stalls.sh bench/configs/meta-llama__Llama-3.1-8B.json 2 "k_gemv" 4 2>&1 | tail -40
find $OUT -type f -delete
