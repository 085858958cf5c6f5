# Session 53, call 3 (H200 only, ~330 s; from the repository root): issue 22's 1,024-client sweep
# (71.7% of its roofline, bar 75%) is prefill-bound: its roofline is 10.0 s of prefill and 2.8 s of
# decode. The sweep at 1,024 clients with the default 8,192-token steps against 16,384, each level's
# step split from kaon's /metrics (bench/serve.py's server_steps) beside the roofline's seconds.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt; grep -q H200 /tmp/gpu.txt || exit 0
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc" /tmp/build_stdout.txt | head -1
source tests/gpu/runs/run21/env.sh
O=$OUT
for bt in 8192 16384; do
    echo "== sweep 1024, max-num-batched-tokens $bt"
    CONCURRENCY=1024 NUM_PROMPTS=1024 MAX_NUM_SEQS=1024 EXTRA_SERVE_ARGS="--max-num-batched-tokens $bt" \
        OUT=$O/sweep$bt timeout 140 bash bench/gpu_sweep.sh > $O/sweep$bt.txt 2>&1
    grep -h '"kind": "serve_roofline"' $O/sweep$bt.txt | tail -1
done
find $O -type f ! -name "serve-kaon-*.json" -delete
