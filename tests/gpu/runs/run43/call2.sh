# Session 59, call 2 (an H200 for issue 22's batch-1 figure; ~420 s; from the repository root; carry
# .debs, .whl, .snap with .snap/alt_linear/cuda_linear.cu = 18bc1e1's). The batch-1 GEMV with two
# rounds of weight loads in flight per warp (gemv_dots' DB: down's 14,336-column rows take 7 rounds;
# o, qkv and gate/up rows take one or four and are unchanged). "alt" = the one-round loop, built in
# the same call. GEMV tests, bf16 batch 1 alternating x3 (issue 22's figure), both traces.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
cp build-gpu/kaon /tmp/kaon-head
f=src/backend/cuda/cuda_linear.cu
cp $f /tmp/head_linear.cu && cp .snap/alt_linear/cuda_linear.cu $f && ninja -C build-gpu kaon > /tmp/alt_build.txt 2>&1 \
    && cp build-gpu/kaon /tmp/kaon-alt; echo "alt build rc=$?"; cp /tmp/head_linear.cu $f; touch $f
ninja -C build-gpu kaon gpu_driver > /dev/null 2>&1; echo "head rebuild rc=$?"
echo "== GEMV tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py -k "test_linear or norm_split" 2>&1 \
    | grep -E "passed|failed|Error|assert" | tail -6
C8=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== bf16 batch 1 (bench/gpu_decode.py --tokens 256), alternating"
for i in 1 2 3; do
    for v in head alt; do
        echo -n "$v: "; timeout 80 python3 bench/gpu_decode.py --config $C8 --tokens 256 --kaon /tmp/kaon-$v 2>&1 \
            | grep -E "^decode|^copy" | tr '\n' ' '; echo
    done
done
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
for v in head alt; do
    echo "== bf16 batch-1 trace, $v"
    mkdir -p /tmp/b-$v && cp /tmp/kaon-$v /tmp/b-$v/kaon
    KAON_BUILD=/tmp/b-$v timeout 100 bash tests/gpu/trace_decode.sh $C8 0 32 1 32 2>&1 | head -16
    mv $OUT/trace_*Llama-3.1-8B*.txt $OUT/trace_bf16_b1_$v.txt 2> /dev/null
done
find $OUT -type f ! -name "trace_*.txt" -delete
