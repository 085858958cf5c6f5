# Session 60, call 5 (any GPU; one call for calls 3 and 4 when device time is short; ~500 s;
# from the repository root; carry .debs, .whl). The MoE norm fusion's tests and A/B first, then
# the same-device comm test, then the PDL-off trace while time is left.
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== MoE norm fusion and MoE tests"
timeout 270 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
    -k "norm_fused or small_vs_transformers or test_moe_op" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|passed|failed|Error|assert" | cut -c1-260 | tail -12
C=bench/configs/Qwen__Qwen3-30B-A3B.json
for e in 1 0 1 0; do
    echo -n "Qwen3-30B-A3B b1 moe_norm_fuse=$e: "; KAON_MOE_NORM_FUSE=$e timeout 60 python3 bench/gpu_decode.py \
        --config $C --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-120
done
echo "== NCCL communicator: same_device ($(( $(date +%s) - T0 )) s in)"
NCCL_DEBUG=WARN timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k same_device 2>&1 | tail -2
if [ $(( $(date +%s) - T0 )) -lt 440 ]; then
    gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c -L/usr/local/cuda/lib64 \
        -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
    echo "== trace, Qwen3-30B-A3B batch 1, KAON_PDL=0"
    KAON_PDL=0 timeout 60 bash tests/gpu/trace_decode.sh $C 0 32 1 16 | sed -n 2,13p
fi
find $OUT -type f ! -name "trace_*.txt" -delete
