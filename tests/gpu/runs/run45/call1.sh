# Session 60, call 1 (an H200 for issue 18's letter; ~300 s; from the repository root; carry .debs,
# .whl). Issue 18's one-GPU points again after the same-device driver fix (ranks meet after
# recording a graph): the NCCL communicator at world size 1, the one-shot kernel with 2 ranks on
# one GPU, tensor / expert parallel on CUDA (run_all.sh tp), bench/multigpu.sh refusing one GPU.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
for k in world_size_1 same_device all_gpus; do
    echo "== NCCL communicator: $k"
    NCCL_DEBUG=WARN timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py -k $k 2>&1 | tail -4
done
echo "== the one-shot kernel's bench, 2 ranks on one GPU"
timeout 60 "$(ls -t /tmp/pytest-of-*/pytest-*/comm*/comm_nccl_driver | head -1)" 2 same bench 2>&1 | tail -4
echo "== tensor / expert parallel on CUDA, ranks on one GPU"
OUT=$OUT timeout 200 tests/gpu/run_all.sh tp 2>&1 | tail -2
echo "== bench/multigpu.sh 2 with one GPU"
timeout 30 bench/multigpu.sh 2; echo "rc=$?"
find $OUT -type f ! -name "trace_*.txt" -delete
