#!/usr/bin/env bash
# Batch-1 decode of chosen configs under several switches (A/B of one change each), each variant
# KAON_AB_ROUNDS times (interleaved, so clock drift hits all alike).
#   KAON_AB="base KAON_GEMV_OCC=1" KAON_AB_CONFIGS="meta-llama__Llama-3.1-8B deepseek-v2-lite-shape" tests/gpu/ab_decode.sh
cd "$(dirname "$0")/../.."
[ -f .debs/unpack.sh ] && source .debs/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
K=${KAON_BUILD:-$PWD/build-gpu}/kaon
ids=$(python3 -c 'print(",".join(str(1000 + i * 7919 % 30000) for i in range(32)))')
for cfg in ${KAON_AB_CONFIGS:-meta-llama__Llama-3.1-8B}; do
    C=bench/configs/$cfg.json
    for round in $(seq "${KAON_AB_ROUNDS:-1}"); do
        for v in ${KAON_AB:-base KAON_PDL=0 KAON_CUDA_GRAPHS=0}; do
            e=(); [ "$v" != base ] && e=($v)
            echo "$cfg $v: $(env "${e[@]}" "$K" run --device cuda --load-format dummy -m $C --prompt-ids "$ids" -n 256 --temp 0 --ignore-eos --print-ids --ctx-size 320 2>&1 >/dev/null | tail -n 2 | tr "\n" " ")"
        done
    done
done
