# Session 59, call 2 (an H200 for issue 22's batch-1 figure; any GPU runs the rest; ~450 s; from the
# repository root; carry .debs, .whl, .snap with .snap/alt/cuda_quant.cu = 6391a87's). Issue 22's
# bf16 batch-1 figure on this tree (the one-wave decode attention has not run on an H200), its trace,
# then run42/call4.sh (k_qact_norm's tests and Q4_0 A/B, FP8 decode-attention stages, ncu of the
# batch-1 x 64-key attention).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
C8=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== bf16 batch 1 (bench/gpu_decode.py --tokens 256), three rounds"
for i in 1 2 3; do
    timeout 80 python3 bench/gpu_decode.py --config $C8 --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode|^copy" | tail -2
done
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
echo "== bf16 batch-1 trace"
timeout 120 bash tests/gpu/trace_decode.sh $C8 0 32 1 32 2>&1 | head -24
bash tests/gpu/runs/run42/call4.sh
