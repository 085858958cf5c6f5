# Call 1 (session 46): the persistent norm GEMVs of KAON_GEMV_FUSE=1 (unrun): the bit-exact test,
# then batch-1 decode A/B (alternating; KAON_GEMV_NORM_BPS 2 and 3), the prefill 8k bar figure and
# ncu's view of the wgmma prefill attention kernel; the kernel's two changes of session 46 A/B
# (lean copies, softmax pinned ahead of the P V wait). Figures to stdout (~8 files come back).
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== tests"; timeout 150 python3 -m pytest -q tests/gpu/test_gpu.py -k "gemv_fuse or small_vs_transformers or test_linear or rope or silu or (test_attention_prefill and wgmma)" 2>&1 | tail -3
echo "== attn_bench 32/8 heads: default (lean copies, softmax pinned) / KAON_FA_WGMMA_PIN=0 / KAON_FA_WGMMA_LEAN=0 (the old kernel), twice"
for r in 1 2; do for e in "X=1" "KAON_FA_WGMMA_PIN=0" "KAON_FA_WGMMA_LEAN=0"; do
    env $e timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 | python3 -c "import sys,json; print('$e', [(d['T'], d['p0'], d['TFLOPs']) for d in map(json.loads, sys.stdin)])"
done; done
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2
python3 bench/roofline.py $C --prefill $OUT/p8k.json
echo "== prefill 8192, the old attention kernel (KAON_FA_WGMMA_LEAN=0)"
KAON_FA_WGMMA_LEAN=0 timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k_old.json 2>&1 | tail -2
python3 bench/roofline.py $C --prefill $OUT/p8k_old.json
echo "== batch-1 decode: separate / fused bps2 / fused bps3, twice"
for r in 1 2; do
    for e in "KAON_GEMV_FUSE=0" "KAON_GEMV_FUSE=1 KAON_GEMV_NORM_BPS=2" "KAON_GEMV_FUSE=1 KAON_GEMV_NORM_BPS=3"; do
        echo -n "$e: "; env $e timeout 100 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"
    done
done
echo "== batch-1 trace, fused"
KAON_GEMV_FUSE=1 OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -14
echo "== ncu: the wgmma prefill attention kernel, 8192 tokens (32/8 heads), its first launch"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2> /dev/null | head -1)
KAON_ATTN_BENCH_T=8192 timeout 150 "$NCU" --clock-control none -k regex:k_fa_prefill_wgmma -c 1 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section Occupancy build-gpu/gpu_driver attn_bench 32 8 128 16384 0 2>&1 \
    | grep -v "^==PROF==" | grep -E "^\s+[A-Z].*[0-9]" | head -90
