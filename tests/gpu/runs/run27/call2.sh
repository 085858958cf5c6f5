# Call 2 (session 46): the wgmma prefill kernel's softmax pinned ahead of the P V wait (alone, no
# moved rescale) against the lean default; ncu's stall reasons of the default; the HTTP sweep at 256.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== tests (default, then KAON_FA_WGMMA_PIN=1)"
timeout 100 python3 -m pytest -q tests/gpu/test_gpu.py -k "test_attention_prefill and wgmma" 2>&1 | tail -1
KAON_FA_WGMMA_PIN=1 timeout 100 python3 -m pytest -q tests/gpu/test_gpu.py -k "test_attention_prefill and wgmma" 2>&1 | tail -1
echo "== attn_bench 32/8 heads: default (lean) / KAON_FA_WGMMA_PIN=1, twice"
for r in 1 2; do for e in "X=1" "KAON_FA_WGMMA_PIN=1"; do
    env $e timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 | python3 -c "import sys,json; print('$e', [(d['T'], d['p0'], d['TFLOPs']) for d in map(json.loads, sys.stdin)])"
done; done
for e in "X=1" "KAON_FA_WGMMA_PIN=1"; do
    echo "== prefill 8192 ($e)"
    env $e timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
        --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
    python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
done
echo "== ncu stall reasons: the default wgmma prefill kernel, 8192 tokens, first launch"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2> /dev/null | head -1)
st=smsp__average_warps_issue_stalled
m=smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle lg_throttle mio_throttle not_selected selected no_instruction drain membar dispatch_stall branch_resolving imc_miss tex_throttle sleeping misc; do
    m=$m,${st}_${r}_per_issue_active.ratio
done
KAON_ATTN_BENCH_T=8192 timeout 150 "$NCU" --clock-control none -k regex:k_fa_prefill_wgmma -c 1 --metrics "$m" \
    build-gpu/gpu_driver attn_bench 32 8 128 16384 0 2>&1 | grep -E "^\s+(smsp|sm__|l1tex)" | sed 's/smsp__average_warps_issue_stalled_//'
echo "== sweep 256"
O=$OUT
CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256 OUT=$O/sweep256 timeout 200 bash bench/gpu_sweep.sh > $O/sweep256.txt 2>&1; tail -4 $O/sweep256.txt
find $O -type f ! -name "serve-kaon-*.json" ! -name "sweep256.txt" -delete
