# Session 60, call 4 (any GPU, right after call 3 on the same machine; ~200 s). Issue 16: where
# Qwen3-30B-A3B's batch-1 step goes now, with the MoE norms fused: the trace, and the trace without
# programmatic dependent launch (KAON_PDL=0: each kernel's own time, no early-launched blocks'
# waiting counted in it), and batch 1 with PDL off.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
C=bench/configs/Qwen__Qwen3-30B-A3B.json
echo "== trace, Qwen3-30B-A3B batch 1"
timeout 150 bash tests/gpu/trace_decode.sh $C 0 32 1 16 | sed -n 2,13p
echo "== trace, Qwen3-30B-A3B batch 1, KAON_PDL=0"
KAON_PDL=0 timeout 150 bash tests/gpu/trace_decode.sh $C 0 32 1 16 | sed -n 2,13p
echo -n "Qwen3-30B-A3B b1 pdl=0: "; KAON_PDL=0 timeout 100 python3 bench/gpu_decode.py --config $C \
    --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-120
find $OUT -type f ! -name "trace_*.txt" -delete
