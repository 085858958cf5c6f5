# Session 60, call 3 (any GPU; ~450 s; from the repository root; carry .debs, .whl). (1) Issue 18:
# the same-device driver fix (test_comm_nccl.py world_size_1, same_device). (2) Issue 16: the MoE
# layer between two split norms (norm_moe_residual, KAON_MOE_NORM_FUSE): its test against
# transformers with the kernels apart as the yardstick, the MoE model and op tests, Qwen3-30B-A3B
# batch 1 fused / apart.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
for k in world_size_1 same_device; do
    echo "== NCCL communicator: $k"
    NCCL_DEBUG=WARN timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k $k 2>&1 | tail -3
done
echo "== MoE norm fusion and MoE tests"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
    -k "norm_fused or small_vs_transformers or real_size_dummy or test_moe_op" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|passed|failed|Error|assert" | cut -c1-300 | tail -14
C=bench/configs/Qwen__Qwen3-30B-A3B.json
for e in 1 0 1 0; do
    echo -n "Qwen3-30B-A3B b1 moe_norm_fuse=$e: "; KAON_MOE_NORM_FUSE=$e timeout 100 python3 bench/gpu_decode.py \
        --config $C --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-120
done
find $OUT -type f ! -name "trace_*.txt" -delete
