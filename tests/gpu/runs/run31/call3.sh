# Session 48, call 3 (any one GPU): the split norm for block-FP8 layers (residual FP8 GEMV, 1 / rms in
# the per-group activation quantization) and INT4 ones (residual / normed k_t4_gemv): their tests,
# FP8 / W4A16 / bf16 batch-1 A/B (KAON_NORM_SPLIT=0), the FP8 split trace; on an H200 also issue
# 22's prefill-8k and 64 / 256 in flight figures.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
R=${KAON_GPU_RESULTS:-/tmp/kaon_gpu_results}
echo "== tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -8
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py -k "norm_split" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py -k "norm_split or model or fused" 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
grep -h '"int4_norm_split"' $R/results.jsonl 2>/dev/null | cut -c1-300 | head -2
grep -h '"fp8_norm_split"\|"fp8_model"' $R/results.jsonl 2>/dev/null | cut -c1-400 | head -4
C=bench/configs/meta-llama__Llama-3.1-8B.json
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== batch-1 decode, FP8 block: split (default) / KAON_NORM_SPLIT=0, twice; bf16 with the qkv RoPE fusion off too, twice"
for r in 1 2; do for v in 1 0; do echo -n "fp8 split=$v: "; KAON_NORM_SPLIT_QUANT=1 KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config $C8 --tokens 256 2>&1 | grep -E "^decode"; done; done
for r in 1 2; do for v in "KAON_QKV_ROPE=1" "KAON_QKV_ROPE=0" "KAON_NORM_SPLIT=0"; do echo -n "bf16 $v: "; env $v \
    timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
for v in 1 0; do echo -n "W4A16 split=$v: "; KAON_NORM_SPLIT_QUANT=1 KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config bench/configs/llama-3.1-8b-awq-g128.json --tokens 256 2>&1 | grep -E "^decode"; done
if ! grep -q H200 /tmp/gpu.txt; then
echo "== trace, FP8 split"
KAON_NORM_SPLIT_QUANT=1 OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -16
echo "== trace, bf16 split + qkv RoPE"
KAON_QKV_ROPE=1 OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -12
find $OUT -type f -delete; exit 0
fi
echo "== prefill 8192"
timeout 90 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo "== 64 / 256 in flight, 1024 / 1024"
timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 2>&1 | grep -vi "info" | tail -4
find $OUT -type f -delete
