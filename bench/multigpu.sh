#!/usr/bin/env bash
# The whole multi-GPU check for N GPUs in one script (issues 18, 19): the GPU links (topo), the
# NCCL communicator at world size N (comm: tests/gpu/test_comm_nccl.py), all-reduce time and
# bandwidth 8 KB .. 256 MB, one-shot P2P and NCCL (arbench), tensor parallelism on N distinct
# devices against one rank (tp: tests/gpu/test_tp_cuda.py -k nccl), and Llama-3.1-8B (dummy bf16
# weights, the same numbers in every layout) at -tp N against -tp 1: greedy ids (greedy:
# tests/gpu/tp_greedy_check.py), batch-1 decode (decode: bench/gpu_decode.py, also with NCCL
# alone) and 256 requests in flight, 1,024 + 1,024 tokens (throughput: bench/gpu_throughput.py).
# Builds nothing: it runs $KAON_BUILD (default build-gpu, tests/gpu/run_all.sh build makes it).
# Fails at once when fewer than N GPUs are visible. Logs and results.jsonl / bench.jsonl go to
# $OUT (default /tmp/kaon_multigpu_out).
#
#   bench/multigpu.sh N [STEP ...]   STEP: topo comm arbench tp greedy processes decode throughput (default: all;
#                                    processes: only where mpirun is installed)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${1:-}
STEPS=("${@:2}")
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
step() {  # name command...: runs it (at most $STEP_TIMEOUT s), its output to $OUT/name.log, and notes the outcome
    local name=$1; shift
    local t0=$SECONDS
    timeout "${STEP_TIMEOUT:-300}" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && fails=$((fails + 1))
    summary+=("$name: rc=$rc ($(( SECONDS - t0 )) s): $(tail -n 1 "$OUT/$name.log" | cut -c1-200)")
    echo "== $name rc=$rc"
}
want() { [ ${#STEPS[@]} -eq 0 ] && return 0; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
K=$KAON_BUILD/kaon

if want topo; then
    { nvidia-smi topo -m; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv; } > "$OUT/topo.log" 2>&1
    summary+=("topo: $(grep -E '^GPU0' "$OUT/topo.log" | tr -s ' ' | cut -c1-120)")
fi
want comm && step comm_nccl env KAON_NCCL_WORLD="$N" python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py
if want arbench; then
    # All-reduce time and bandwidth, 8 KB .. 256 MB: the one-shot path where it applies, NCCL alone,
    # and the one-shot path forced up to 64 MB (to see where NCCL overtakes it).
    python3 -c "import sys; sys.path.insert(0, 'tests/gpu'); from test_comm_nccl import build_driver; \
from pathlib import Path; build_driver(Path('$OUT/comm_nccl_driver'))" > "$OUT/arbench_build.log" 2>&1
    step arbench_default "$OUT/comm_nccl_driver" "$N" bench
    step arbench_nccl env KAON_P2P_AR=0 "$OUT/comm_nccl_driver" "$N" bench
    step arbench_p2p64m env KAON_P2P_AR_MAX=67108864 "$OUT/comm_nccl_driver" "$N" bench
fi
want tp && step tp_cuda env KAON_TP_SIZES="$N" python3 -m pytest -q -rA -p no:cacheprovider -s tests/gpu/test_tp_cuda.py \
    -k "nccl or refused"
want greedy && step greedy_tp$N python3 tests/gpu/tp_greedy_check.py --kaon "$K" --tp "$N"
# The same -tp N as a multi-node job of N processes on this host (one GPU each, NCCL between
# processes; src/dist/cluster.h), where Open MPI is installed and kaon was built with it.
if want processes && command -v mpirun > /dev/null; then
    step greedy_tp${N}_processes env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        python3 tests/gpu/tp_greedy_check.py --kaon "$K" --tp "$N" --launcher "mpirun -np $N --bind-to none"
fi
if want decode; then
    step decode_tp1 python3 bench/gpu_decode.py --kaon "$K" --tp 1 --tokens 256 --json "$OUT/bench.jsonl"
    step decode_tp$N python3 bench/gpu_decode.py --kaon "$K" --tp "$N" --tokens 256 --json "$OUT/bench.jsonl"
    step decode_tp${N}_nccl env KAON_P2P_AR=0 python3 bench/gpu_decode.py --kaon "$K" --tp "$N" --tokens 256 \
        --json "$OUT/bench.jsonl"
fi
if want throughput; then
    # 256 requests in flight, 1,024 prompt + 1,024 output tokens each (issue 19's figure).
    step throughput_tp1 python3 bench/gpu_throughput.py --kaon "$K" --tp 1 --requests 256 --output 1024 \
        --json "$OUT/bench.jsonl"
    step throughput_tp$N python3 bench/gpu_throughput.py --kaon "$K" --tp "$N" --requests 256 --output 1024 \
        --json "$OUT/bench.jsonl"
fi

echo
echo "==== multi-GPU check, $N GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/tp_cuda.log" ] && grep -hE "relative L2|sequences equal" "$OUT/tp_cuda.log" | tail -n 12
for f in "$OUT"/arbench_*.log; do [ -f "$f" ] && { echo "-- $(basename "$f")"; cat "$f"; }; done
grep -h '"kind": "decode"\|"kind": "throughput"' "$OUT/bench.jsonl" 2> /dev/null | tail -n 6 | cut -c1-400
[ $fails -eq 0 ] && echo "all passed" || echo "$fails step(s) failed"
exit $(( fails > 0 ))
