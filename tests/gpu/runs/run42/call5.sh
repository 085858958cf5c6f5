# Session 58, call 5 (an H200 for the letter of issue 18's acceptance; any one GPU runs it; ~400 s; from
# the repository root; carry .debs, .whl; a warm machine keeps build-gpu). Issue 18's one-GPU points:
# the NCCL communicator at world size 1 through the same code path, every collective
# (tests/gpu/test_comm_nccl.py), tensor and expert parallelism on CUDA with every rank on this GPU
# against one rank (tests/gpu/test_tp_cuda.py via run_all.sh tp), and bench/multigpu.sh (issue 19's
# check) refusing at once with one GPU visible.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|error" /tmp/build_stdout.txt | head -8
source tests/gpu/runs/run21/env.sh
echo "== NCCL communicator"
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_comm_nccl.py 2>&1 | grep -E "PASSED|SKIPPED|FAILED|passed|failed|Error" | tail -6
echo "== tensor / expert parallel on CUDA, ranks on one GPU"
OUT=$OUT timeout 420 tests/gpu/run_all.sh tp 2>&1 | tail -12
echo "== bench/multigpu.sh 2 with one GPU"
timeout 30 bench/multigpu.sh 2; echo "rc=$?"
