# Session 62, call 1 (any GPU; <= 540 s; from the repository root; carry .debs, .whl). Tests of what
# sessions 60-61 wrote when no device came: the MoE layer between split norms (norm_moe_residual,
# KAON_MOE_NORM_FUSE=1) and DeepSeek's split norms with it; the early down kernel
# (KAON_MOE_DOWN_EARLY=1, bit-equal to off); the routing's key max (the moe op tests); the
# same-device comm test (issue 18); then, while time is left, Qwen3-30B-A3B batch 1 both ways.
# call2.sh times the rest. Each section is skipped when the call has run too long for it.
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== MoE: early down bit-equal, the op tests, norm fusion vs transformers ($(el) s in)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
    -k "down_early or test_moe_op or norm_fused" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|^early|passed|failed|Error|assert" | cut -c1-240 | tail -16
echo "== the GEMVs (early loads now kept before the PDL wait), k_qact_norm bit-equal, split norms vs transformers ($(el) s in)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py \
    -k "fused_norm_bit_equal or (norm_split_vs_transformers and not 8b) or gemv" 2>&1 \
    | grep -E "passed|failed|Error|assert" | cut -c1-240 | tail -3
if [ $(el) -lt 330 ]; then
    echo "== the MoE model tests and DeepSeek vs transformers with both switches on ($(el) s in)"
    export KAON_MOE_NORM_FUSE=1 KAON_MOE_DOWN_EARLY=1
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -k "small_vs_transformers" 2>&1 \
        | grep -E "passed|failed|Error|assert" | cut -c1-240 | tail -4
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_deepseek_hf.py -k "tiny_cuda or v2_lite_shape" 2>&1 \
        | grep -E "passed|failed|Error|assert" | cut -c1-240 | tail -4
    unset KAON_MOE_NORM_FUSE KAON_MOE_DOWN_EARLY
fi
if [ $(el) -lt 480 ]; then
    echo "== NCCL communicator: same_device ($(el) s in)"
    NCCL_DEBUG=WARN timeout 40 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k same_device 2>&1 | tail -2
fi
for fe in "0 0" "1 1" "1 0"; do
    [ $(el) -lt 490 ] || break
    set -- $fe
    echo -n "Qwen3-30B-A3B b1 fuse=$1 early=$2 ($(el) s in): "; KAON_MOE_NORM_FUSE=$1 KAON_MOE_DOWN_EARLY=$2 timeout 45 \
        python3 bench/gpu_decode.py --config bench/configs/Qwen__Qwen3-30B-A3B.json --tokens 256 --kaon build-gpu/kaon 2>&1 \
        | grep -E "^decode" | tail -1 | cut -c1-100
done
echo "done in $(el) s"
find $OUT -type f ! -name "trace_*.txt" -delete
