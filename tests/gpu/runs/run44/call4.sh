# Session 60, call 4 (any GPU; ~450 s; from the repository root; carry .debs, .whl). Issue 15's serving
# step at session 59's default (2 stages a warp for the FP8 decode attention in batched launches):
# the 483 x 1,500 FP8 trace (session 58: 31.25 ms, attention 597 us a layer on the H100), then on an
# H200 the 3,000-request run (run39/h200.sh).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
echo "== trace, FP8 block weights, KV fp8, 483 x 1500"
TRACE_EXTRA="--kv-cache-dtype fp8" timeout 200 bash tests/gpu/trace_decode.sh bench/configs/llama-3.1-8b-fp8-block.json 0 1500 483 4 | head -10
grep -q H200 /tmp/gpu.txt && TP_LIMIT=${TP_LIMIT:-240} bash tests/gpu/runs/run39/h200.sh
find $OUT -type f ! -name "trace_*.txt" -delete
