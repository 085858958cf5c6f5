#!/usr/bin/env bash
# Why the decode-attention kernel takes its time at one gpu_driver dec_bench case: ncu's stall reasons
# (average warps stalled per issued instruction), issue and warp-slot use, DRAM throughput, duration,
# for one launch of that case (the dec_bench cases in order: 0 B1 x 1K, 1 B1 x 4K, 2 B1 x 32K,
# 3 B64 x 1K, 4 B64 x 2K, 5 B64 x 4K, 6 B256 x 1K, 7 B256 x 1.5K, 8 B256 x 2K, 9 B1 x 64; 55 launches each).
#   tests/gpu/ncu_dec.sh CASE [fp8|bf16] [sass]     (needs build-gpu/gpu_driver: tests/gpu/run_all.sh build)
# sass: also the SASS lines with the most warp-stall samples (ncu's source page; $OUT/ncu_dec_sass.csv).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
mkdir -p "$OUT"
CASE=$1 KV=${2:-bf16} SASS=${3:-}
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
st=smsp__average_warps_issue_stalled
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle lg_throttle mio_throttle not_selected selected no_instruction drain membar dispatch_stall branch_resolving imc_miss tex_throttle; do
    m=$m,${st}_${r}_per_issue_active.ratio
done
# The case's 10th launch (after its 5 warm-ups and 4 timed ones).
timeout 300 "$NCU" --clock-control none -k "regex:k_decode" --launch-skip $((CASE * 55 + 9)) --launch-count 1 \
    --metrics "$m" --csv --page raw "${KAON_GPU_DRIVER:-build-gpu/gpu_driver}" dec_bench 32 8 128 $KV \
    > "$OUT/ncu_dec_raw.csv" 2> "$OUT/ncu_dec.err"
python3 - "$OUT/ncu_dec_raw.csv" << 'PY'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
rows = list(csv.reader(lines[start:]))
hdr, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
for r in data:
    v = dict(zip(hdr, r))
    print(f"== {v['Kernel Name'][:90]} {v.get('Grid Size', '')} x {v.get('Block Size', '')}")
    for h in hdr:
        if h.startswith(("gpu__time", "dram__", "sm__warps", "smsp__issue")):
            print(f"   {h:70s} {v[h]}")
    stalls = sorted(((float(v[h].replace(',', '') or 0), h.split('stalled_')[1].split('_per_')[0]) for h in hdr
                     if 'stalled_' in h), reverse=True)
    print("   stalls per issue: " + ", ".join(f"{n} {x:.2f}" for x, n in stalls if x >= 0.05))
PY
[ "$SASS" = sass ] || exit 0
skip=$((CASE * 55 + 9))
timeout 300 "$NCU" --clock-control none -k "regex:k_decode" --launch-skip $skip --launch-count 1 --set full \
    --import-source no -f -o /tmp/ncu_dec "${KAON_GPU_DRIVER:-build-gpu/gpu_driver}" dec_bench 32 8 128 $KV \
    > /dev/null 2>> "$OUT/ncu_dec.err"
"$NCU" --import /tmp/ncu_dec.ncu-rep --page source --print-source sass --csv > "$OUT/ncu_dec_sass.csv" 2>> "$OUT/ncu_dec.err" \
    || { echo "ncu's source page failed: $(tail -2 "$OUT/ncu_dec.err")"; exit 0; }
python3 - "$OUT/ncu_dec_sass.csv" << 'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hi = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" == c for c in r)), None)
if hi is None:
    sys.exit("no header in the source page")
hdr = rows[hi]
col = next((c for c in hdr if "Warp Stall Sampling (All" in c), None) or next((c for c in hdr if "Stall" in c), None)
src = "Source" if "Source" in hdr else hdr[1]
data = [dict(zip(hdr, r)) for r in rows[hi + 1:] if len(r) == len(hdr)]
def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0
tot = sum(num(d[col]) for d in data) or 1.0
print(f"== SASS lines by '{col}' ({len(data)} lines, {tot:.0f} samples)")
for d in sorted(data, key=lambda d: -num(d[col]))[:30]:
    print(f"   {num(d[col]) / tot:6.1%}  {d.get('Address', '')}  {d[src][:100]}")
PY
