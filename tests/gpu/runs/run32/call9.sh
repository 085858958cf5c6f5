# Session 49's two kernels in one call for the next session (any one GPU, ~420 s; one start instead
# of two): call7.sh's INT4 refill A/B (the caller puts `git show 43edf4a:src/backend/cuda/cuda_int4.cu`
# in alt/) and call8.sh's KAON_FP8_SILU_MIX A/B, sharing one build.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
cp build-gpu/kaon /tmp/kaon-head
CA=bench/configs/llama-3.1-8b-awq-g128.json C8=bench/configs/llama-3.1-8b-fp8-block.json
echo -n "W4A16 head: "; timeout 30 python3 bench/gpu_decode.py --kaon /tmp/kaon-head --config $CA --tokens 256 2>&1 | grep -E "^decode"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
timeout 40 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_int4.py -k bandwidth 2>&1 | grep -E "INT4 GEMV" | grep -v "n=4"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "mix or norm_split or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2; do for v in 0 1; do echo -n "FP8 mix=$v: "; KAON_FP8_SILU_MIX=$v timeout 40 python3 bench/gpu_decode.py \
    --kaon /tmp/kaon-head --config $C8 --tokens 256 2>&1 | grep -E "^decode"; done; done
mkdir -p /tmp/kh && cp /tmp/kaon-head /tmp/kh/kaon
echo "== trace, W4A16 (head)"; KAON_BUILD=/tmp/kh OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $CA 0 64 1 16 | head -8
cp src/backend/cuda/cuda_int4.cu /tmp/head_int4.cu && cp alt/cuda_int4.cu src/backend/cuda/ && ninja -C build-gpu kaon > /tmp/alt_build.txt 2>&1 \
    && cp build-gpu/kaon /tmp/kaon-alt; echo "alt build rc=$?"; cp /tmp/head_int4.cu src/backend/cuda/cuda_int4.cu
for r in 1 2; do for v in head alt; do echo -n "W4A16 $v: "; timeout 30 python3 bench/gpu_decode.py \
    --kaon /tmp/kaon-$v --config $CA --tokens 256 2>&1 | grep -E "^decode"; done; done
find $OUT -type f -delete
