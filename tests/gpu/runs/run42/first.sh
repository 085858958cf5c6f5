# Session 58, first call (any GPU; from the repository root; carry .debs, .whl, .llama; rebuild the
# .llama tarball first if it is gone: run40/vs_llama.sh's header). On an H200: run41/call2.sh (issue 22's
# llama.cpp ratios on the bar's machine, then issue 15's 3,000-request FP8 figure, ~560 s). On an H100:
# the FP8 decode step of issue 15's serving shape, traced only where all 483 sequences decode
# (trace_decode.sh passes TRACE_TOKENS=483: the steps whose k_step_mark grid is 483 tokens), at 1,000
# and 1,500 tokens of context: where the 3,000 run's ~29 ms decode-only steps go.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    bash tests/gpu/runs/run41/call2.sh
    exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
for ctx in 1000 1500; do
    echo "== trace, FP8 block weights, KV fp8, 483 x $ctx (all-decode steps)"
    TRACE_EXTRA="--kv-cache-dtype fp8" timeout 240 bash tests/gpu/trace_decode.sh bench/configs/llama-3.1-8b-fp8-block.json \
        0 $ctx 483 4 | sed -n 1,26p
    grep -E "preempt|warn" $OUT/trace_llama-3.1-8b-fp8-block_l0_b483.log | tail -3
done
find $OUT -type f ! -name "trace_*.txt" -delete
