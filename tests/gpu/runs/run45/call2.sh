# Session 60, call 2 (any GPU; ~250 s; from the repository root; carry .debs, .whl). (1) Issue 18:
# the same-device driver fix (test_comm_nccl.py world_size_1 and same_device). (2) Issue 16: the
# MoE small path's kernels without programmatic dependent launch (KAON_PDL=0: each kernel's own
# time, no early-launched waiting counted), Qwen3-30B-A3B batch 1 trace and decode with PDL on/off.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
for k in world_size_1 same_device; do
    echo "== NCCL communicator: $k"
    NCCL_DEBUG=WARN timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k $k 2>&1 | tail -3
done
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
C=bench/configs/Qwen__Qwen3-30B-A3B.json
echo "== trace, Qwen3-30B-A3B batch 1, KAON_PDL=0"
KAON_PDL=0 timeout 150 bash tests/gpu/trace_decode.sh $C 0 32 1 16 | sed -n 2,14p
for e in 1 0; do
    echo -n "Qwen3-30B-A3B b1 pdl=$e: "; KAON_PDL=$e timeout 100 python3 bench/gpu_decode.py --config $C \
        --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-110
done
find $OUT -type f ! -name "trace_*.txt" -delete
