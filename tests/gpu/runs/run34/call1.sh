# Session 50's opt-in kernels for the next session (any GPU, ~330 s): KAON_FP8_QX (the batch-1 FP8
# GEMVs quantize their own activation row) and KAON_T4_SZ16 (INT4 scales as f16 + zero in 4 bytes):
# their bit-equality tests, batch-1 A/Bs, a trace.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "qx or mix or norm_split or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2; do for v in 0 1; do echo -n "FP8 qx=$v: "; KAON_FP8_QX=$v timeout 40 python3 bench/gpu_decode.py \
    --config $C8 --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== trace, FP8 block, QX"; KAON_FP8_QX=1 timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -14
CA=bench/configs/llama-3.1-8b-awq-g128.json
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "sz16 or norm_split or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2; do for v in 0 1; do echo -n "W4A16 sz16=$v: "; KAON_T4_SZ16=$v timeout 40 python3 bench/gpu_decode.py \
    --config $CA --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
find $OUT -type f -delete
