# Session 62, call 2 (any GPU; ~450 s; right after call1.sh on the warm machine: its build is there).
# Batch-1 A/B of the MoE switches, alternating (fuse = KAON_MOE_NORM_FUSE, early =
# KAON_MOE_DOWN_EARLY), then Qwen3-30B-A3B's kernel map without PDL (true per-kernel times; the
# PDL trace charges a kernel's early-launched wait to it) to choose the next MoE kernel work.
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
echo "== trace, Qwen3-30B-A3B batch 1, KAON_PDL=0 ($(( $(date +%s) - T0 )) s in)"
KAON_PDL=0 timeout 150 bash tests/gpu/trace_decode.sh bench/configs/Qwen__Qwen3-30B-A3B.json 0 32 1 16 | head -22
echo "done in $(( $(date +%s) - T0 )) s"
find $OUT -type f ! -name "trace_*.txt" -delete
