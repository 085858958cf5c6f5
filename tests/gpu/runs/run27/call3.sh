# Call 3 (session 46): issue 22's bars on whichever card comes (the acceptance is on the H200):
# batch 1, prefill 8k, 64 / 256 in flight (1,024 / 1,024), the HTTP sweep at 1,024 clients, and a
# trace of a 64-sequence decode step (where the 64-in-flight time goes). Figures to stdout.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== batch-1 decode, twice"
for r in 1 2; do timeout 100 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo "== 64 / 256 in flight, 1024 / 1024"
timeout 200 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 2>&1 | grep -vi "info" | tail -6
echo "== trace: 64 sequences, 512-token prompts, decode steps"
OUT=$OUT bash tests/gpu/trace_decode.sh $C 0 512 64 8 | head -24
echo "== sweep 1024"
O=$OUT
CONCURRENCY=1024 NUM_PROMPTS=1024 MAX_NUM_SEQS=1024 OUT=$O/sweep1024 timeout 200 bash bench/gpu_sweep.sh > $O/sweep1024.txt 2>&1; tail -4 $O/sweep1024.txt
find $O -type f ! -name "serve-kaon-*.json" ! -name "sweep1024.txt" -delete
