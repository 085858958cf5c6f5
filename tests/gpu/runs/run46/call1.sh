# Session 61, call 1 (any GPU; ~480 s; from the repository root; carry .debs, .whl). Session 60's
# MoE layer between split norms (norm_moe_residual, opt-in KAON_MOE_NORM_FUSE=1) and DeepSeek's
# split norms around MLA and the experts (with the same switch), written when no device came:
# their tests against transformers, then batch-1 A/B on Qwen3-30B-A3B and the V2-Lite shape,
# then the same-device comm test (issue 18). If all pass: make KAON_MOE_NORM_FUSE default on.
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== MoE norm fusion: its test, the MoE model and op tests"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
    -k "norm_fused or small_vs_transformers or (test_moe_op and not fp8)" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|passed|failed|Error|assert" | cut -c1-240 | tail -10
echo "== DeepSeek on CUDA vs transformers with the split norms (KAON_MOE_NORM_FUSE=1)"
KAON_MOE_NORM_FUSE=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_deepseek_hf.py \
    -k "tiny_cuda or v2_lite_shape" 2>&1 | grep -E "passed|failed|Error|assert" | cut -c1-240 | tail -6
for C in bench/configs/Qwen__Qwen3-30B-A3B.json bench/configs/deepseek-v2-lite-shape.json; do
    for e in 1 0; do
        echo -n "$(basename $C .json) b1 fuse=$e: "; KAON_MOE_NORM_FUSE=$e timeout 45 python3 bench/gpu_decode.py \
            --config $C --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-110
    done
done
echo "== NCCL communicator: same_device ($(( $(date +%s) - T0 )) s in)"
NCCL_DEBUG=WARN timeout 40 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k same_device 2>&1 | tail -2
find $OUT -type f ! -name "trace_*.txt" -delete
