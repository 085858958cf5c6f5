#!/usr/bin/env bash
# Where one decode step's time goes, kernel by kernel: ncu (hardware counters, clocks left alone)
# over `kaon run` on dummy weights with CUDA graphs off, then tests/gpu/profile_table.py prints
# the last decode step (the kernels after the second-to-last k_sample) grouped per kernel.
# Needs build-gpu (tests/gpu/run_all.sh build) and a runtime where ncu reads counters.
#
#   tests/gpu/profile_decode.sh CONFIG [LAYERS] [PROMPT_LEN] [BATCH]
# BATCH > 1 runs `kaon bench latency` with that batch instead of `kaon run`.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
mkdir -p "$OUT"
B=${KAON_BUILD:-$PWD/build-gpu}/kaon
CONFIG=$1 LAYERS=${2:-4} PLEN=${3:-64} BATCH=${4:-1}
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
tag=$(basename "$CONFIG" .json)_l${LAYERS}_b${BATCH}
cut=/tmp/$tag.json
python3 - "$CONFIG" "$LAYERS" "$cut" << 'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
(c.get("text_config") or c)["num_hidden_layers"] = int(sys.argv[2])
json.dump(c, open(sys.argv[3], "w"))
EOF
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range($PLEN)))")
if [ "$BATCH" -gt 1 ]; then
    cmd=("$B" bench latency --device cuda --load-format dummy -m "$cut" --batch-sizes "$BATCH" --input-len "$PLEN"
         --output-len 3 --num-iters 1 --num-iters-warmup 0 --quiet)
else
    cmd=("$B" run --device cuda --load-format dummy -m "$cut" --prompt-ids "$ids" -n 3 --temp 0 --ignore-eos --print-ids
         --ctx-size $((PLEN + 32)))
fi
KAON_CUDA_GRAPHS=0 timeout 400 "$NCU" --clock-control none --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
    "${cmd[@]}" > "$OUT/ncu_$tag.csv" 2> "$OUT/ncu_$tag.err"
echo "ncu rc=$? ($tag)"
python3 tests/gpu/profile_table.py "$OUT/ncu_$tag.csv" | tee "$OUT/profile_$tag.txt"
