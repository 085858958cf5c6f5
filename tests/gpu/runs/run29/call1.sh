# Session 47 call 1 (issue 15): the persistent FP8 GEMV (x staged in shared memory, gate and up
# through one ring, block scales in the ring's slots) and its in-GEMV activation quantization
# (KAON_FP8_GEMV_QUANT=1): the FP8 tests both ways, then batch-1 decode A/B against the previous
# kernel (old_cuda_fp8.cu, put beside the snapshot by the caller), and a kernel trace.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
cp build-gpu/kaon /tmp/kaon-new
cp src/backend/cuda/cuda_fp8.cu /tmp/new_fp8.cu && cp old_cuda_fp8.cu src/backend/cuda/cuda_fp8.cu &&
    ninja -C build-gpu kaon > /tmp/old_build.txt 2>&1 && cp build-gpu/kaon /tmp/kaon-old; echo "old build rc=$?"
cp /tmp/new_fp8.cu src/backend/cuda/cuda_fp8.cu; cp /tmp/kaon-new build-gpu/kaon
echo "== fp8 tests (default)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
echo "== fp8 tests (KAON_FP8_GEMV_QUANT=1)"
KAON_FP8_GEMV_QUANT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "linear or model" 2>&1 | grep -E "passed|failed|Error|assert" | tail -6
C=bench/configs/llama-3.1-8b-fp8-block.json
echo "== batch-1 decode, FP8 block: old / new / new + quant in GEMV, twice"
for r in 1 2; do
    for v in old new quant; do
        k=/tmp/kaon-$v; [ $v = quant ] && k=/tmp/kaon-new
        echo -n "$v: "; env $([ $v = quant ] && echo KAON_FP8_GEMV_QUANT=1 || echo X=1) timeout 100 \
            python3 bench/gpu_decode.py --kaon $k --config $C --tokens 256 2>&1 | grep -E "^decode"
    done
done
echo "== batch-1 decode, FP8 channel: old / new"
for v in old new; do echo -n "$v: "; timeout 100 python3 bench/gpu_decode.py --kaon /tmp/kaon-$v \
    --config bench/configs/llama-3.1-8b-fp8-channel.json --tokens 256 2>&1 | grep -E "^decode"; done
echo "== trace, new + quant"
KAON_FP8_GEMV_QUANT=1 OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -16
echo "== trace, old"
cp /tmp/kaon-old build-gpu/kaon; OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -16
find $OUT -type f -delete
