#!/usr/bin/env bash
# Why chosen kernels of one decode step take their time: ncu's stall reasons (average warps stalled
# per issued instruction, by reason), achieved occupancy, DRAM throughput and duration, over `kaon
# run` on dummy weights with CUDA graphs off (the decode step's launches, not the prefill's: -s).
#   tests/gpu/ncu_stalls.sh CONFIG LAYERS KERNEL_REGEX [COUNT]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
mkdir -p "$OUT"
B=${KAON_BUILD:-$PWD/build-gpu}/kaon
CONFIG=$1 LAYERS=$2 RX=$3 COUNT=${4:-4}
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
cut=/tmp/stalls_$(basename "$CONFIG")
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); (c.get('text_config') or c)['num_hidden_layers']=int(sys.argv[2]); json.dump(c,open(sys.argv[3],'w'))" "$CONFIG" "$LAYERS" "$cut"
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(64)))")
st=smsp__average_warps_issue_stalled
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle lg_throttle mio_throttle not_selected selected no_instruction drain membar dispatch_stall branch_resolving imc_miss tex_throttle; do
    m=$m,${st}_${r}_per_issue_active.ratio
done
# Skip the prefill's launches of these kernels: the last COUNT matches are decode steps.
KAON_CUDA_GRAPHS=0 timeout 300 "$NCU" --clock-control none -k "regex:$RX" --metrics "$m" --csv --page raw \
    "$B" run --device cuda --load-format dummy -m "$cut" --prompt-ids "$ids" -n 3 --temp 0 --ignore-eos --print-ids \
    --ctx-size 128 > "$OUT/stalls_raw.csv" 2> "$OUT/stalls.err"
python3 - "$OUT/stalls_raw.csv" "$COUNT" << 'PY'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))  # kaon's and ncu's own lines come first
rows = list(csv.reader(lines[start:]))
hdr = rows[0]
data = [r for r in rows[2:] if len(r) == len(hdr)]
ki = hdr.index("Kernel Name")
last = {}
for r in data:
    last.setdefault(r[ki].split("(")[0], []).append(r)
for k, rs in last.items():
    r = rs[-1]
    vals = {h: r[i] for i, h in enumerate(hdr)}
    print(f"== {k} {vals.get('Grid Size', '')} x {vals.get('Block Size', '')}")
    for h in hdr:
        if h.startswith(("gpu__", "dram__", "sm__", "smsp__issue")) and h.endswith((".avg", "pct_of_peak_sustained_active", "pct_of_peak_sustained_elapsed", "cycle")) and ".max." not in h and ".min." not in h and ".sum." not in h or h == "gpu__time_duration.sum":
            print(f"   {h:70s} {vals[h]}")
    stalls = sorted(((float(vals[h].replace(',', '') or 0), h.split('stalled_')[1].split('_per_')[0]) for h in hdr
                     if 'stalled_' in h), reverse=True)
    print("   stalls per issue: " + ", ".join(f"{n} {v:.2f}" for v, n in stalls if v >= 0.05))
PY
