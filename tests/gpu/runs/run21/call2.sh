# Call 2: expert parallel on CUDA (helper-51's tree): moe op tests incl. expert ranges, EP TP tests.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; grep -E "build rc|error" $OUT/build_stdout.txt | head
source tests/gpu/runs/run21/env.sh
timeout 200 python3 -m pytest -q tests/gpu/test_gpu_moe.py -k "test_moe_op" > $OUT/pytest_moe.txt 2>&1; tail -15 $OUT/pytest_moe.txt
timeout 250 python3 -m pytest -q tests/gpu/test_tp_cuda.py -k ep > $OUT/pytest_ep.txt 2>&1; tail -25 $OUT/pytest_ep.txt
