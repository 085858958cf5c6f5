# Session 60, call 6 (any GPU; ~330 s; from the repository root; carry .debs, .whl): the lean form
# of call 5 for the session's last device minutes. The MoE norm fusion's tests, its A/B on
# Qwen3-30B-A3B batch 1, the same-device comm test.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== MoE norm fusion and MoE tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
    -k "norm_fused or small_vs_transformers or (test_moe_op and not fp8)" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|passed|failed|Error|assert" | cut -c1-260 | tail -12
C=bench/configs/Qwen__Qwen3-30B-A3B.json
for e in 1 0; do
    echo -n "Qwen3-30B-A3B b1 moe_norm_fuse=$e: "; KAON_MOE_NORM_FUSE=$e timeout 45 python3 bench/gpu_decode.py \
        --config $C --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-120
done
echo "== NCCL communicator: same_device"
NCCL_DEBUG=WARN timeout 40 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k same_device 2>&1 | tail -2
find $OUT -type f ! -name "trace_*.txt" -delete
