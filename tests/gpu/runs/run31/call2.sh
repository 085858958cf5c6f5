# Session 48, call 2 (any one GPU): the batch-1 RMSNorm split around the GEMVs (default on,
# KAON_NORM_SPLIT=0 off): its tests against transformers, the batch-1 A/B (alternating, two rounds,
# bf16 Llama-3.1-8B and the 2-layer Qwen3 with biases-free q/k norms via Qwen3-8B), a trace of the
# split step; on an H200 also issue 22's prefill-8k and 64 / 256 in flight figures.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
echo "== tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py -k "norm_split or small_vs_transformers or test_linear" 2>&1 | grep -E "passed|failed|Error|assert" | tail -8
grep -h norm_split ${KAON_GPU_RESULTS:-/tmp/kaon_gpu_results}/results.jsonl 2>/dev/null | cut -c1-300 | head -4
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== batch-1 decode: split (default) / KAON_NORM_SPLIT=0, twice"
for r in 1 2; do for v in 1 0; do echo -n "split=$v: "; KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
for v in 1 0; do echo -n "Qwen3-8B split=$v: "; KAON_NORM_SPLIT=$v timeout 60 python3 bench/gpu_decode.py \
    --kaon build-gpu/kaon --config bench/configs/Qwen__Qwen3-8B.json --tokens 256 2>&1 | grep -E "^decode"; done
echo "== trace, split"
OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $C 0 64 1 16 | head -16
grep -q H200 /tmp/gpu.txt || { find $OUT -type f -delete; exit 0; }
echo "== prefill 8192"
timeout 90 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo "== 64 / 256 in flight, 1024 / 1024"
timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --requests 64 256 --output 1024 2>&1 | grep -vi "info" | tail -4
find $OUT -type f -delete
