#!/usr/bin/env bash
# FP8 MoE figures on the GPU machine after `tests/gpu/run_all.sh build`: Qwen3-30B-A3B FP8 vs bf16
# (batch-1 decode, 64 in flight) and DeepSeek-V3 with FP8 block weights cut to 5 layers (projected
# to 61). Dummy weights from the real configs; results to $OUT/fp8_moe_bench.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kaon_gpu_out}
K=${KAON_BUILD:-$PWD/build-gpu}/kaon
J=$OUT/fp8_moe_bench.jsonl
C=bench/configs
for what in ${FP8_MOE_BENCH:-decode v3 tput}; do
    case $what in
    decode)
        python3 bench/gpu_decode.py --kaon "$K" --config $C/Qwen__Qwen3-30B-A3B-FP8.json --json "$J"
        python3 bench/gpu_decode.py --kaon "$K" --config $C/Qwen__Qwen3-30B-A3B.json --json "$J" ;;
    v3)
        python3 bench/gpu_decode.py --kaon "$K" --config $C/deepseek-ai__DeepSeek-V3.json --layers 5 --project-layers 61 \
            --json "$J" ;;
    tput)
        python3 bench/gpu_throughput.py --kaon "$K" --config $C/Qwen__Qwen3-30B-A3B-FP8.json --requests 64 --json "$J"
        python3 bench/gpu_throughput.py --kaon "$K" --config $C/Qwen__Qwen3-30B-A3B.json --requests 64 --json "$J" ;;
    esac
done
