# Session 62, call 2 (optional: call1 already measured the switches once on an H100 -- the norm fusion slower; any GPU; ~300 s).
# Batch-1 A/B of the MoE switches, alternating (fuse = KAON_MOE_NORM_FUSE, early =
# KAON_MOE_DOWN_EARLY). Compare "0 0" with session 60's 245.9 tok/s (H100) for the routing and
# first-weights changes of session 61, which have no switch (same card kind only).
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
for C in Qwen__Qwen3-30B-A3B deepseek-v2-lite-shape; do
    for round in 1 $([ $C = Qwen__Qwen3-30B-A3B ] && echo 2); do
        for fe in "0 0" "1 0" "1 1"; do
            set -- $fe
            echo -n "$C r$round fuse=$1 early=$2: "; KAON_MOE_NORM_FUSE=$1 KAON_MOE_DOWN_EARLY=$2 timeout 45 python3 \
                bench/gpu_decode.py --config bench/configs/$C.json --tokens 256 --kaon build-gpu/kaon 2>&1 \
                | grep -E "^decode" | tail -1 | cut -c1-100
        done
    done
done
echo "done in $(( $(date +%s) - T0 )) s"
find $OUT -type f ! -name "trace_*.txt" -delete
