# Call 2 (session 45, H200): where the 8k prefill's 0.24-0.25 s goes, kernel by kernel (CUPTI
# trace of `kaon bench latency`'s measured prefill: the third k_sample ends it), and the
# batch-1 decode step at 86% of roofline. Figures to stdout.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
lib=/tmp/libkaon_trace.so
gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c -L/usr/local/cuda/lib64 \
    -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o $lib || echo "no trace lib"
echo "== prefill 8192 trace"
KAON_TRACE_OUT=/tmp/trace_p8k.csv CUDA_INJECTION64_PATH=$lib timeout 120 build-gpu/kaon bench latency --device cuda \
    --load-format dummy -m $C --batch-sizes 1 --input-len 8192 --output-len 2 --num-iters 1 --num-iters-warmup 1 --quiet 2>&1 | tail -2
python3 tests/gpu/trace_table.py /tmp/trace_p8k.csv 0 3 | head -40
echo "== batch-1 decode trace"
OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -30
echo "== batch-1 decode"
timeout 120 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode|copy"
