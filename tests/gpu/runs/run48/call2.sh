# Session 62, call 2 (any GPU; <= 560 s; from the repository root; carry .debs, .whl). Batch 1's
# MoE down kernel with one warp per output row (KAON_MOE_B1_DOWN=1, k_moe_small_down_b1): bit-equal
# to k_moe_small_down, then Qwen3-30B-A3B batch 1 both ways, the kernel map without PDL (session
# 62's: down 18.40 us, route 9.30 a layer), and where k_moe_route_small's warps stall (ncu's
# per-instruction samples).
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name --format=csv,noheader
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error|pdl_check" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== bit-equal, both switches ($(el) s in)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s -k "b1_down or down_early" 2>&1 \
    | grep -E "us/call|passed|failed|Error|assert" | cut -c1-200 | tail -12
C=bench/configs/Qwen__Qwen3-30B-A3B.json
for round in 1 2; do
    for on in 1 0; do
        [ $(el) -lt 330 ] || break 2
        echo -n "Qwen3-30B-A3B b1 KAON_MOE_B1_DOWN=$on r$round: "; KAON_MOE_B1_DOWN=$on timeout 45 \
            python3 bench/gpu_decode.py --config $C --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-100
    done
done
if [ $(el) -lt 380 ]; then
    echo "== trace, KAON_PDL=0, KAON_MOE_B1_DOWN=1 ($(el) s in)"
    KAON_MOE_B1_DOWN=1 KAON_PDL=0 timeout 120 bash tests/gpu/trace_decode.sh $C 0 32 1 16 | grep -v "^run rc" | head -14 | cut -c1-110
fi
if [ $(el) -lt 470 ]; then
    echo "== ncu: k_moe_route_small per instruction ($(el) s in)"
    python3 -c "
import json; c = json.load(open('$C')); c['num_hidden_layers'] = 2; json.dump(c, open('/tmp/q2l.json', 'w'))"
    ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(64)))")
    KAON_CUDA_GRAPHS=0 timeout 80 ncu --clock-control none -k regex:k_moe_route_small --launch-skip 2 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        build-gpu/kaon run --device cuda --load-format dummy -m /tmp/q2l.json --prompt-ids "$ids" -n 3 --temp 0 \
        --ignore-eos --print-ids --ctx-size 96 > $OUT/route_sass.csv 2> /tmp/ncu.err
    echo "ncu rc=$? $(wc -l < $OUT/route_sass.csv) lines"; tail -3 /tmp/ncu.err
fi
echo "done in $(el) s"
find $OUT -type f ! -name "trace_*.txt" ! -name "route_sass.csv" -delete
