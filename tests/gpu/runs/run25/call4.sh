# Call 4 (session 45): RoPE + KV write with 4-byte pairs and 4 tokens per block; its tests,
# the 8k prefill traced and through `kaon bench latency`, batch 1, the HTTP sweep at 256 and 1,024.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== tests"; timeout 170 python3 -m pytest -q -x tests/gpu/test_gpu.py -k "silu or rope or small_vs_transformers" 2>&1 | tail -2
lib=/tmp/libkaon_trace.so
gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c -L/usr/local/cuda/lib64 \
    -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o $lib || echo "no trace lib"
echo "== prefill 8192 trace"
KAON_TRACE_OUT=/tmp/trace_p8k.csv CUDA_INJECTION64_PATH=$lib timeout 120 build-gpu/kaon bench latency --device cuda \
    --load-format dummy -m $C --batch-sizes 1 --input-len 8192 --output-len 2 --num-iters 1 --num-iters-warmup 1 --quiet 2>&1 | tail -1
python3 tests/gpu/trace_table.py /tmp/trace_p8k.csv 0 3 | head -9
echo "== prefill 8192"
timeout 120 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/latency_prefill_8192.json 2>&1 | tail -2
echo "== batch-1 decode"
timeout 120 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 --json $OUT/decode.jsonl 2>&1 | grep -E "^decode|copy"
echo "== sweep 256"
O=$OUT
CONCURRENCY=256 NUM_PROMPTS=512 MAX_NUM_SEQS=256 OUT=$O/sweep256 timeout 170 bash bench/gpu_sweep.sh > $O/sweep256.txt 2>&1; tail -4 $O/sweep256.txt | head -1
CONCURRENCY=1024 NUM_PROMPTS=1024 MAX_NUM_SEQS=1024 OUT=$O/sweep1024 timeout 200 bash bench/gpu_sweep.sh > $O/sweep1024.txt 2>&1; tail -4 $O/sweep1024.txt | head -1
find $O -type f ! -name "serve-kaon-*.json" ! -name "latency_prefill_8192.json" ! -name "decode.jsonl" -delete
