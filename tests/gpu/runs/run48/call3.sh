# Written in session 62 (no device came for it); the next session's first call (~470 s; from the
# repository root; carry .debs, .whl). On an H200, issue 18's one-GPU points first (call1.sh's:
# NCCL world size 1, two ranks on one device, run_all.sh tp, bench/multigpu.sh refusing one
# GPU); then on any GPU the batch-1 MoE down kernel and the cluster routing (bit-equal;
# Qwen3-30B-A3B with and without each; the routing kernel's per-instruction stalls). Each part is
# skipped when the call has run too long for it (LIMIT seconds).
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
LIMIT=${LIMIT:-470}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error|pdl_check" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
if [[ $gpu == *H200* ]]; then
    for k in world_size_1 same_device; do
        echo "== NCCL communicator: $k ($(el) s in)"
        NCCL_DEBUG=WARN timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k $k 2>&1 \
            | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|NCCL version|Error" | cut -c1-240 | tail -4
    done
    echo "== tensor / expert parallel on CUDA, ranks on one GPU ($(el) s in)"
    OUT=$OUT timeout 150 tests/gpu/run_all.sh tp 2>&1 | tail -2
    timeout 30 bench/multigpu.sh 2 > /tmp/mg.txt 2>&1; echo "bench/multigpu.sh 2: rc=$? $(tail -1 /tmp/mg.txt)"
fi
if [ $(el) -lt $(( LIMIT - 60 )) ]; then
    echo "== KAON_MOE_B1_DOWN / KAON_MOE_DOWN_EARLY / KAON_MOE_ROUTE_CLUSTER bit-equal ($(el) s in)"
    timeout $(( LIMIT - $(el) > 150 ? 150 : LIMIT - $(el) )) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py -s \
        -k "b1_down or down_early or route_cluster" 2>&1 | grep -E "us/call|passed|failed|Error|assert" | cut -c1-200 | tail -20
fi
if [ $(el) -lt $(( LIMIT - 150 )) ]; then
    echo "== the batch-1 down kernel's residual form (KAON_MOE_NORM_FUSE=1) vs transformers ($(el) s in)"
    KAON_MOE_B1_DOWN=1 KAON_MOE_NORM_FUSE=1 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_moe.py \
        -k "norm_fused" 2>&1 | grep -E "passed|failed|Error|assert" | cut -c1-200 | tail -3
fi
C=bench/configs/Qwen__Qwen3-30B-A3B.json
# Switch sets (B1_DOWN DOWN_EARLY ROUTE_CLUSTER): all on, off, the down kernel alone, the cluster
# routing alone; twice.
for sw in 111 000 100 001 111 000 100 001; do
    [ $(el) -lt $(( LIMIT - 45 )) ] || break
    echo -n "Qwen3-30B-A3B b1 B1_DOWN=${sw:0:1} DOWN_EARLY=${sw:1:1} ROUTE_CLUSTER=${sw:2:1} ($(el) s in): "
    KAON_MOE_B1_DOWN=${sw:0:1} KAON_MOE_DOWN_EARLY=${sw:1:1} KAON_MOE_ROUTE_CLUSTER=${sw:2:1} timeout 40 \
        python3 bench/gpu_decode.py --config $C --tokens 256 --kaon build-gpu/kaon 2>&1 | grep -E "^decode" | tail -1 | cut -c1-100
done
if [ $(el) -lt $(( LIMIT - 50 )) ]; then
    echo "== ncu: k_moe_route_small per instruction ($(el) s in)"
    python3 -c "
import json; c = json.load(open('$C')); c['num_hidden_layers'] = 2; json.dump(c, open('/tmp/q2l.json', 'w'))"
    ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(64)))")
    KAON_CUDA_GRAPHS=0 timeout 45 ncu --clock-control none -k regex:k_moe_route_small --launch-skip 2 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        build-gpu/kaon run --device cuda --load-format dummy -m /tmp/q2l.json --prompt-ids "$ids" -n 3 --temp 0 \
        --ignore-eos --print-ids --ctx-size 96 > $OUT/route_sass.csv 2> /tmp/ncu.err
    echo "ncu rc=$? $(wc -l < $OUT/route_sass.csv) lines"; tail -2 /tmp/ncu.err
fi
if [ $(el) -lt $(( LIMIT - 40 )) ]; then
    echo "== trace, KAON_PDL=0, the three switches on ($(el) s in)"
    KAON_MOE_B1_DOWN=1 KAON_MOE_DOWN_EARLY=1 KAON_MOE_ROUTE_CLUSTER=1 KAON_PDL=0 timeout 35 bash tests/gpu/trace_decode.sh $C 0 32 1 16 | grep -v "^run rc" | head -8 | cut -c1-110
fi
echo "done in $(el) s"
find $OUT -type f ! -name "trace_*.txt" ! -name "route_sass.csv" -delete
