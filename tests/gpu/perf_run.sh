#!/usr/bin/env bash
# The performance part of a GPU call, after tests/gpu/run_all.sh has built build-gpu: prefill
# and decode through `kaon bench latency` (warmed up: no first-call costs), batch-1 decode
# against the roofline (bench/gpu_decode.py), and offline throughput at 64 and 256 in flight
# (bench/gpu_throughput.py). Figures go to stdout and $OUT/perf.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
B=${KAON_BUILD:-$PWD/build-gpu}/kaon
C=bench/configs/meta-llama__Llama-3.1-8B.json
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null  # the carried Debian libraries (cJSON, ...)
{
for L in 1024 8192; do
    echo "## bench latency: prefill of $L tokens (batch 1)"
    timeout 120 "$B" bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len $L \
        --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json "$OUT/latency_prefill_$L.json" 2>&1 | tail -3
    python3 bench/roofline.py $C --prefill "$OUT/latency_prefill_$L.json"
done
echo "## bench latency: batch 1 and 64, 512-token prompts, 128 new tokens"
timeout 150 "$B" bench latency --device cuda --load-format dummy -m $C --batch-sizes 1,64 --input-len 512 \
    --output-len 128 --num-iters 2 --num-iters-warmup 1 --quiet --output-json "$OUT/latency_ladder.json" 2>&1 | tail -4
echo "## batch-1 decode vs the roofline"
timeout 120 python3 bench/gpu_decode.py --kaon "$B" --tokens 256 --json "$OUT/bench.jsonl" 2>&1 | grep -E "^decode|copy"
echo "## throughput, 1024-token prompts, 1024 outputs"
timeout 240 python3 bench/gpu_throughput.py --kaon "$B" --requests 64 256 --output 1024 --json "$OUT/bench.jsonl" 2>&1 | grep "in flight"
} 2>&1 | tee -a "$OUT/perf.log"
