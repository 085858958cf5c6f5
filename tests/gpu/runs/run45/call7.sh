# Session 60, call 7 (any GPU; ~170 s; from the repository root; carry .debs, .whl): the least that
# checks the MoE norm fusion (its test on the small Qwen3-MoE and Qwen2-MoE, one A/B pair).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s -k "norm_fused and (qwen3moe or qwen2moe)" 2>&1 \
    | grep -E "^(qwen|mixtral)[^ ]* \{|passed|failed|Error|assert" | cut -c1-260 | tail -6
for e in 1 0; do
    echo -n "Qwen3-30B-A3B b1 moe_norm_fuse=$e: "; KAON_MOE_NORM_FUSE=$e timeout 40 python3 bench/gpu_decode.py \
        --config bench/configs/Qwen__Qwen3-30B-A3B.json --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-120
done
find $OUT -type f -delete
