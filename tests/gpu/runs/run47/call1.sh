# Session 62, call 1 (any GPU; ~420 s; from the repository root; carry .debs, .whl). Tests of what
# sessions 60-61 wrote when no device came: the MoE layer between split norms (norm_moe_residual,
# KAON_MOE_NORM_FUSE=1) and DeepSeek's split norms with it; the early down kernel
# (KAON_MOE_DOWN_EARLY=1, bit-equal to off); the same-device comm test (issue 18). call2.sh times them.
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== MoE: norm fusion vs transformers, early down bit-equal, the op and model tests ($(( $(date +%s) - T0 )) s in)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
    -k "norm_fused or down_early or small_vs_transformers or (test_moe_op and not fp8)" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|^early|passed|failed|Error|assert" | cut -c1-240 | tail -16
echo "== the model tests with both switches on"
KAON_MOE_NORM_FUSE=1 KAON_MOE_DOWN_EARLY=1 timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_gpu_moe.py -k "small_vs_transformers or dummy_qwen3_30b" 2>&1 | grep -E "passed|failed|Error|assert" | cut -c1-240 | tail -4
echo "== DeepSeek on CUDA vs transformers, split norms and early down ($(( $(date +%s) - T0 )) s in)"
KAON_MOE_NORM_FUSE=1 KAON_MOE_DOWN_EARLY=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_deepseek_hf.py \
    -k "tiny_cuda or v2_lite_shape" 2>&1 | grep -E "passed|failed|Error|assert" | cut -c1-240 | tail -6
echo "== NCCL communicator: same_device ($(( $(date +%s) - T0 )) s in)"
NCCL_DEBUG=WARN timeout 40 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k same_device 2>&1 | tail -2
echo "done in $(( $(date +%s) - T0 )) s"
find $OUT -type f ! -name "trace_*.txt" -delete
