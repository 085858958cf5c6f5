# Session 48, call 5 (H200 only, ~200 s): issue 22's batch-1 bar with the split norm and the qkv
# RoPE fusion (default) against KAON_NORM_SPLIT=0 (default, off, default); the 8k prefill; FP8 block batch 1 A/B (split
# off, and up's rows prefetched into L2 during gate: KAON_FP8_UP_PREFETCH=1).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt; grep -q H200 /tmp/gpu.txt || exit 0
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
C=bench/configs/meta-llama__Llama-3.1-8B.json
for v in 1 0 1; do echo -n "bf16 split=$v: "; KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done
echo "== prefill 8192"
timeout 90 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
C8=bench/configs/llama-3.1-8b-fp8-block.json
for v in "KAON_NORM_SPLIT=1" "KAON_FP8_UP_PREFETCH=1" "KAON_NORM_SPLIT=0"; do echo -n "fp8 $v: "; env $v timeout 60 \
    python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode"; done
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "model or norm_split" 2>&1 | grep -E "passed|failed|Error|assert" | tail -3
find $OUT -type f -delete
