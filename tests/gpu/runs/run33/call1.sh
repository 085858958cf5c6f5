# Session 50, call 1 (any GPU, ~220 s): where W4A16 / FP8 / bf16 batch-1 decode steps lose time after
# the INT4 refill fix: whole traces (every kernel, not the top 5), and ncu's stall reasons for the
# INT4 GEMVs.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json C8=bench/configs/llama-3.1-8b-fp8-block.json
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== trace, W4A16"; timeout 60 bash tests/gpu/trace_decode.sh $CA 0 64 1 16 | head -40
echo "== ncu, W4A16 k_t4_gemv"; timeout 200 bash tests/gpu/ncu_stalls.sh $CA 2 k_t4_gemv 4 2>&1 | tail -12
echo "== trace, FP8 block"; timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -30
echo "== trace, bf16"; timeout 60 bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -24
find $OUT -type f -delete
