# Call 1 (session 46): the persistent norm GEMVs of KAON_GEMV_FUSE=1 (unrun): the bit-exact test,
# then batch-1 decode A/B (alternating; KAON_GEMV_NORM_BPS 2 and 3), the prefill 8k bar figure and
# the HTTP sweep at 256 clients. Figures to stdout (the device returns ~8 files at most).
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== tests"; timeout 150 python3 -m pytest -q tests/gpu/test_gpu.py -k "gemv_fuse or small_vs_transformers or test_linear or rope or silu" 2>&1 | tail -3
echo "== batch-1 decode: separate / fused bps2 / fused bps3, twice"
for r in 1 2; do
    for e in "KAON_GEMV_FUSE=0" "KAON_GEMV_FUSE=1 KAON_GEMV_NORM_BPS=2" "KAON_GEMV_FUSE=1 KAON_GEMV_NORM_BPS=3"; do
        echo -n "$e: "; env $e timeout 100 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"
    done
done
echo "== batch-1 trace, fused"
KAON_GEMV_FUSE=1 OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -14
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2
python3 bench/roofline.py $C --prefill $OUT/p8k.json
echo "== sweep 256"
O=$OUT
CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256 OUT=$O/sweep256 timeout 170 bash bench/gpu_sweep.sh > $O/sweep256.txt 2>&1; tail -4 $O/sweep256.txt | head -1
find $O -type f ! -name "serve-kaon-*.json" -delete
