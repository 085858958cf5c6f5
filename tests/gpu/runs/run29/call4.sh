# Session 47, the last call (budget for one): the persistent FP8 GEMV and KAON_FP8_GEMV_FUSE=1
# A/B (old/ = the CUDA sources of da7e6bb, put beside the snapshot by the caller), the persistent
# W4A16 GEMV (helper-54) tests and A/B, then issue 22's prefill-8k / batch-1 / attention figures.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
cp build-gpu/kaon /tmp/kaon-new
echo "== fp8 tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
echo "== int4 tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6

cp old/* src/backend/cuda/ && ninja -C build-gpu kaon > /tmp/old_build.txt 2>&1 && cp build-gpu/kaon /tmp/kaon-old; echo "old build rc=$?"
cp /tmp/kaon-new build-gpu/kaon
C8=bench/configs/llama-3.1-8b-fp8-block.json
echo "== batch-1 decode, FP8 block: old / new / new + KAON_FP8_GEMV_FUSE=1, twice"
for r in 1 2; do
    for v in old new fuse; do
        k=/tmp/kaon-$v; [ $v = fuse ] && k=/tmp/kaon-new
        echo -n "$v: "; env $([ $v = fuse ] && echo KAON_FP8_GEMV_FUSE=1 || echo X=1) timeout 60 \
            python3 bench/gpu_decode.py --kaon $k --config $C8 --tokens 256 2>&1 | grep -E "^decode"
    done
done
echo "== batch-1 decode, W4A16 (AWQ g128): old / new, twice"
for r in 1 2; do for v in old new; do echo -n "$v: "; timeout 60 python3 bench/gpu_decode.py --kaon /tmp/kaon-$v \
    --config bench/configs/llama-3.1-8b-awq-g128.json --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== trace, FP8 new + fuse"
KAON_FP8_GEMV_FUSE=1 OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -14
C=bench/configs/meta-llama__Llama-3.1-8B.json
timeout 40 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 | python3 -c "import sys,json; print('attn TFLOP/s', [(d['T'], d['p0'], d['TFLOPs']) for d in map(json.loads, sys.stdin)])"
echo "== prefill 8192"
timeout 90 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo "== batch-1 decode, bf16"
timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"
find $OUT -type f -delete
