#!/usr/bin/env bash
# Old and new binaries side by side on the H200 (the model-layer acceptance: none of the
# figures worse by more than 2%, best of N each): batch-1 decode (bench/gpu_decode.py), prefill
# of 8,192 tokens (kaon bench latency), and offline throughput at 64 / 256 in flight, 1024 in /
# 1024 out (bench/gpu_throughput.py). Runs alternate old/new so drift hits both alike.
#   tests/gpu/ab_perf.sh OLD_KAON NEW_KAON [decode|prefill|t64|t256 ...] (default: all four)
# Env: RUNS (default 3). Output: $OUT/ab_perf.log and $OUT/ab_perf.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
mkdir -p "$OUT"
OLD=$1 NEW=$2
shift 2
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(decode prefill t64 t256)
RUNS=${RUNS:-3}
C=bench/configs/meta-llama__Llama-3.1-8B.json
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
J=$OUT/ab_perf.jsonl
one() {  # part label binary
    case $1 in
    decode) timeout 120 python3 bench/gpu_decode.py --kaon "$3" --tokens 256 2>&1 | grep -E "^decode" | head -1 ;;
    prefill) timeout 120 "$3" bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
                 --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet 2>&1 | tail -2 | tr '\n' ' ' ;;
    t64) timeout 150 python3 bench/gpu_throughput.py --kaon "$3" --requests 64 --output 1024 2>&1 | grep "in flight" ;;
    t256) timeout 200 python3 bench/gpu_throughput.py --kaon "$3" --requests 256 --output 1024 2>&1 | grep "in flight" ;;
    esac
}
for p in "${parts[@]}"; do
    for r in $(seq 1 "$RUNS"); do
        for which in old new; do
            bin=$OLD; [ $which = new ] && bin=$NEW
            line=$(one "$p" $which "$bin")
            echo "$p run $r $which: $line" | tee -a "$OUT/ab_perf.log"
            python3 -c 'import json,sys; print(json.dumps({"part": sys.argv[1], "run": int(sys.argv[2]), "bin": sys.argv[3], "line": sys.argv[4]}))' \
                "$p" "$r" "$which" "$line" >> "$J"
        done
    done
done
