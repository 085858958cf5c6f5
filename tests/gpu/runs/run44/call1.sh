# Session 60, call 1 (an H200 for issue 18's letter; any one GPU runs the rest; ~400 s; from the
# repository root; carry .debs, .whl). (1) Issue 18's one-GPU points: the NCCL communicator at world
# size 1 (tests/gpu/test_comm_nccl.py; in session 59 its output never came within 120 s: now each
# case alone, 150 s each, with NCCL's warnings), tensor / expert parallel on CUDA (run_all.sh tp), bench/multigpu.sh
# refusing with one GPU.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
# Each case alone, bounded (session 59's run printed nothing within 120 s: a hang in one of them?).
for k in world_size_1 same_device all_gpus; do
    echo "== NCCL communicator: $k"
    NCCL_DEBUG=WARN timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k $k 2>&1 | tail -6
done
echo "== tensor / expert parallel on CUDA, ranks on one GPU"
OUT=$OUT timeout 200 tests/gpu/run_all.sh tp 2>&1 | tail -4
echo "== bench/multigpu.sh 2 with one GPU"
timeout 30 bench/multigpu.sh 2; echo "rc=$?"
find $OUT -type f ! -name "trace_*.txt" -delete
