# Session 62, call 4 (an H200 for issue 22's figure, else any GPU; ~420 s; after call 1 on the warm
# machine). Batch-1 A/B of session 61's early weight loads (cuda_ld.h: k_gemv's MINB 1 forms --
# o_proj and down at batch 1 -- had the PDL wait before all their weight loads): the default build
# against one with -DKAON_WEIGHT_LOADS_NC=1 (the old .nc form), alternating, on Llama-3.1-8B bf16
# (issue 22's bar: 90% of roofline; 250.2 tok/s = 88.4% on the H200 in session 53) and
# Qwen3-30B-A3B.
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name --format=csv,noheader
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error|pdl_check" /tmp/build_stdout.txt | head -8
CUDAFLAGS="-DKAON_WEIGHT_LOADS_NC=1" KAON_BUILD=$PWD/build-gpu-nc tests/gpu/run_all.sh build > /tmp/build_nc.txt 2>&1
grep -E "build rc|error|pdl_check" /tmp/build_nc.txt | head -4
echo "(the nc build's pdl_check is expected to name the sunk loads; $(el) s in)"
source tests/gpu/runs/run21/env.sh
# gpu_decode.py's default config is Llama-3.1-8B (as session 53's figure).
for C in default Qwen__Qwen3-30B-A3B; do
    cfg=(); [ $C = default ] || cfg=(--config bench/configs/$C.json)
    for round in 1 2; do
        for b in build-gpu build-gpu-nc; do
            [ $(el) -lt 540 ] || break 3
            echo -n "$C r$round $b: "; timeout 45 python3 bench/gpu_decode.py "${cfg[@]}" --tokens 256 \
                --kaon $b/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-100
        done
    done
done
echo "done in $(el) s"
find $OUT -type f ! -name "trace_*.txt" -delete
