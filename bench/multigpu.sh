#!/usr/bin/env bash
# The whole multi-GPU check for N GPUs in one script (issue 18): the NCCL communicator at world
# size N (tests/gpu/test_comm_nccl.py), tensor parallelism on N distinct devices over NCCL against
# one rank (tests/gpu/test_tp_cuda.py -k nccl, -tp N), and Llama-3.1-8B (dummy bf16 weights) at
# -tp N: batch-1 decode (bench/gpu_decode.py) and 64 requests in flight (bench/gpu_throughput.py).
# Builds nothing: it runs $KAON_BUILD (default build-gpu, tests/gpu/run_all.sh build makes it).
# Fails at once when fewer than N GPUs are visible. Logs and results.jsonl / bench.jsonl go to
# $OUT (default /tmp/kaon_multigpu_out).
#
#   bench/multigpu.sh N
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${1:-}
if ! [[ "$N" =~ ^[0-9]+$ ]] || [ "$N" -lt 2 ]; then
    echo "usage: bench/multigpu.sh N   (N >= 2 GPUs)" >&2
    exit 2
fi
OUT=${OUT:-/tmp/kaon_multigpu_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 KAON_GPU_RESULTS=$OUT
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KAON_BUILD=${KAON_BUILD:-$ROOT/build-gpu}
# NVLink multicast stays off (it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

visible=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    listed=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
    [ "$listed" -lt "$visible" ] && visible=$listed
fi
if [ "$visible" -lt "$N" ]; then
    echo "bench/multigpu.sh: $N GPUs asked, $visible visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES)" >&2
    exit 1
fi
if [ ! -x "$KAON_BUILD/kaon" ]; then
    echo "bench/multigpu.sh: no kaon at $KAON_BUILD/kaon (build it: tests/gpu/run_all.sh build)" >&2
    exit 1
fi

summary=()
fails=0
step() {  # name command...: runs it, its output to $OUT/name.log, and notes the outcome
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && fails=$((fails + 1))
    summary+=("$name: rc=$rc ($(( SECONDS - t0 )) s): $(tail -n 1 "$OUT/$name.log" | cut -c1-200)")
    echo "== $name rc=$rc"
}

step comm_nccl env KAON_NCCL_WORLD="$N" python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py
step tp_cuda env KAON_TP_SIZES="$N" python3 -m pytest -q -rA -p no:cacheprovider -s tests/gpu/test_tp_cuda.py \
    -k "nccl or refused"
step decode_tp$N python3 bench/gpu_decode.py --kaon "$KAON_BUILD/kaon" --tp "$N" --tokens 256 \
    --json "$OUT/bench.jsonl"
step throughput_tp$N python3 bench/gpu_throughput.py --kaon "$KAON_BUILD/kaon" --tp "$N" --requests 64 \
    --output 1024 --json "$OUT/bench.jsonl"

echo
echo "==== multi-GPU check, $N GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))"
printf '%s\n' "${summary[@]}"
grep -hE "relative L2|sequences equal" "$OUT/tp_cuda.log" | tail -n 12
grep -h '"kind": "decode"\|"kind": "throughput"' "$OUT/bench.jsonl" 2> /dev/null | tail -n 2 | cut -c1-400
[ $fails -eq 0 ] && echo "all passed" || echo "$fails step(s) failed"
exit $(( fails > 0 ))
