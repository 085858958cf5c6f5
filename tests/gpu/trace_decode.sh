#!/usr/bin/env bash
# Where a decode step's time goes in a real run (CUDA graphs and PDL on, clocks as the run keeps
# them): kernel_trace.c collects every kernel's start and end through CUPTI, trace_table.py
# averages the last steps per kernel. Needs build-gpu (tests/gpu/run_all.sh build).
#
#   tests/gpu/trace_decode.sh CONFIG [LAYERS] [PROMPT_LEN] [BATCH] [STEPS]
# LAYERS 0 keeps the config's layer count; BATCH > 1 runs `kaon bench latency` with that batch.
# TRACE_EXTRA: more arguments for the run (e.g. "--kv-cache-dtype fp8").
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
mkdir -p "$OUT"
B=${KAON_BUILD:-$PWD/build-gpu}/kaon
CONFIG=$1 LAYERS=${2:-0} PLEN=${3:-64} BATCH=${4:-1} STEPS=${5:-16}
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
lib=/tmp/libkaon_trace.so
[ -f $lib ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o $lib || exit 1
tag=$(basename "$CONFIG" .json)_l${LAYERS}_b${BATCH}
cut=/tmp/$tag.json
python3 - "$CONFIG" "$LAYERS" "$cut" << 'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if int(sys.argv[2]) > 0:
    (c.get("text_config") or c)["num_hidden_layers"] = int(sys.argv[2])
json.dump(c, open(sys.argv[3], "w"))
PY
n=$((STEPS + 8))
# Batched: the prompts' prefill takes about BATCH x PROMPT_LEN / 8,192 steps, and a sequence starts
# decoding when its own prefill ends; enough new tokens that the last STEPS steps decode them all
# together (with only STEPS + 8 the traced steps were the run's tail of a few sequences).
[ "$BATCH" -gt 1 ] && n=$((n + 2 * ((BATCH * PLEN + 8191) / 8192)))
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range($PLEN)))")
if [ "$BATCH" -gt 1 ]; then
    cmd=("$B" bench latency --device cuda --load-format dummy -m "$cut" --batch-sizes "$BATCH" --input-len "$PLEN"
         --output-len $n --num-iters 1 --num-iters-warmup 0 --quiet ${TRACE_EXTRA:-})
else
    cmd=("$B" run --device cuda --load-format dummy -m "$cut" --prompt-ids "$ids" -n $n --temp 0 --ignore-eos
         --print-ids --ctx-size $((PLEN + n + 32)) ${TRACE_EXTRA:-})
fi
KAON_TRACE_MARK=1 KAON_TRACE_OUT=/tmp/trace_$tag.csv CUDA_INJECTION64_PATH=$lib timeout 300 "${cmd[@]}" > "$OUT/trace_$tag.log" 2>&1
echo "run rc=$? ($tag)"
# Batched: the steps in which all BATCH sequences decode (the mark's grid is a step's tokens).
tok=0; [ "$BATCH" -gt 1 ] && tok=$BATCH
TRACE_TOKENS=$tok python3 tests/gpu/trace_table.py "/tmp/trace_$tag.csv" "$STEPS" | tee "$OUT/trace_$tag.txt"
