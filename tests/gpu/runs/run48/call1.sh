# Session 62, call 1 (an H200 for issue 18's letter; <= 560 s; from the repository root; carry .debs,
# .whl). Issue 18's one-GPU points on an H200 (session 60 ran them on an H100): the NCCL communicator
# at world size 1 and two ranks on one device, tensor / expert parallel on CUDA (run_all.sh tp),
# bench/multigpu.sh refusing one GPU; then DeepSeek vs transformers on CUDA (session 61's run printed
# no result line within its 100 s: now 240 s and pytest's own summary).
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error|pdl_check" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
for k in world_size_1 same_device all_gpus; do
    echo "== NCCL communicator: $k ($(el) s in)"
    NCCL_DEBUG=WARN timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k $k 2>&1 \
        | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|NCCL version|Error" | cut -c1-240 | tail -6
done
echo "== tensor / expert parallel on CUDA, ranks on one GPU ($(el) s in)"
OUT=$OUT timeout 220 tests/gpu/run_all.sh tp 2>&1 | tail -4
echo "== bench/multigpu.sh 2 with one GPU ($(el) s in)"
timeout 30 bench/multigpu.sh 2 > /tmp/mg.txt 2>&1; echo "rc=$? $(tail -1 /tmp/mg.txt)"
if [ $(el) -lt 330 ]; then
    echo "== DeepSeek vs transformers on CUDA ($(el) s in)"
    timeout $(( 550 - $(el) )) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_deepseek_hf.py \
        -k "tiny_cuda or v2_lite_shape" 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed|Error|assert" | cut -c1-240 | tail -8
fi
echo "done in $(el) s"
find $OUT -type f ! -name "trace_*.txt" -delete
