# Session 60, call 5 (any GPU; ~200 s; from the repository root; carry .debs, .whl). Where a Q4_0
# batch-1 step's time goes between steps: session 59's Q4_0 trace had 527 us from one step's sampling
# to the next step's first kernel (bf16: 30 us): the host figure of kaon run beside the rate, whether
# the steps were graphs (KAON_GRAPH_STATS=1), and marked traces.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== Q4_0 batch 1 with the host's share, twice"
Q="bench/gpu_decode_gguf.py --qtype Q4_0 --out-qtype Q6_K --keep /tmp/q40.gguf --tokens 128 --kaon build-gpu/kaon"
for i in 1 2; do timeout 90 python3 $Q 2>&1 | grep "^decode" | tail -1; done
echo "== Q4_0 and bf16 batch 1: were the steps graphs? (KAON_GRAPH_STATS=1)"
ids=$(python3 -c "print(','.join(str(1000 + i * 7919 % 30000) for i in range(32)))")
KAON_GRAPH_STATS=1 timeout 60 build-gpu/kaon run --device cuda -m /tmp/q40.gguf --prompt-ids "$ids" -n 64 --temp 0 \
    --ignore-eos --ctx-size 128 --print-ids 2>&1 > /dev/null | grep -E "graphs|decode steps|tok/s|warn|WARN"
KAON_GRAPH_STATS=1 timeout 90 build-gpu/kaon run --device cuda --load-format dummy -m bench/configs/meta-llama__Llama-3.1-8B.json \
    --prompt-ids "$ids" -n 64 --temp 0 --ignore-eos --ctx-size 128 --print-ids 2>&1 > /dev/null | grep -E "graphs|decode steps|tok/s"
[ -f /tmp/libkaon_trace.so ] || gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c \
    -L/usr/local/cuda/lib64 -L/usr/local/cuda/extras/CUPTI/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
for pi in "" "--print-ids"; do
    echo "== Q4_0 batch-1 trace, marked steps ${pi:-(text printed)}"
    KAON_TRACE_MARK=1 KAON_TRACE_OUT=/tmp/trace_q40m.csv CUDA_INJECTION64_PATH=/tmp/libkaon_trace.so timeout 60 \
        build-gpu/kaon run --device cuda -m /tmp/q40.gguf --prompt-ids "$ids" -n 40 --temp 0 --ignore-eos --ctx-size 128 $pi \
        2>&1 > /dev/null | grep "decode steps"
    python3 tests/gpu/trace_table.py /tmp/trace_q40m.csv 32 | tee $OUT/trace_q40_marked${pi:+_ids}.txt | head -8
done
find $OUT -type f ! -name "trace_*.txt" -delete
