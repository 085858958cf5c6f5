# Session 50, for the next session (any GPU, ~560 s): issue 15's FP8 serving run at 1,000 requests (twice what fits at once)
# (3,000 did not finish in 420 s on the H100), with session 50's admission estimate
# (KAON_ADMIT_RATIO=adaptive) against the default rule.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
for v in adaptive 0; do echo "== FP8 serving, 1000 x 1000/1000, fp8 KV, KAON_ADMIT_RATIO=$v"
    KAON_ADMIT_RATIO=$v timeout 240 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --config $C8 --kv-cache-dtype fp8 \
        --requests 1000 --prompt 1000 --output 1000 2>&1 | grep -E "requests \(|failed" | tail -2; done
find $OUT -type f -delete
