# Session 50's opt-in work for the next session (any GPU, ~330 s): KAON_FP8_QX (the batch-1 FP8 GEMVs
# quantize their own activation row) tests + A/B + trace, and issue 15's FP8 serving run at 500
# requests (3,000 did not finish in 420 s on the H100) with the new admission rule against the old.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
C8=bench/configs/llama-3.1-8b-fp8-block.json
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_fp8.py -k "qx or mix or norm_split or model_cuda" 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
for r in 1 2; do for v in 0 1; do echo -n "FP8 qx=$v: "; KAON_FP8_QX=$v timeout 40 python3 bench/gpu_decode.py \
    --config $C8 --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== trace, FP8 block, QX"; KAON_FP8_QX=1 timeout 60 bash tests/gpu/trace_decode.sh $C8 0 64 1 16 | head -14
for v in "" 0; do echo "== FP8 serving, 500 x 1000/1000, fp8 KV, KAON_ADMIT_RATIO=${v:-adaptive}"
    KAON_ADMIT_RATIO=$v timeout 150 python3 bench/gpu_throughput.py --kaon build-gpu/kaon --config $C8 --kv-cache-dtype fp8 \
        --requests 500 --prompt 1000 --output 1000 2>&1 | grep -E "requests \(|failed" | tail -2; done
find $OUT -type f -delete
