# Session 49, call 2 (any one GPU): on an H200 issue 22's set (call1.sh); elsewhere where W4A16
# batch-1 decode spends its time: the kernel trace, the GEMV alone on Llama-3.1-8B's shapes, batch 1.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
if grep -q H200 /tmp/gpu.txt; then bash tests/gpu/runs/run32/call1.sh; exit 0; fi
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json
for r in 1 2; do echo -n "W4A16: "; timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --config $CA --tokens 256 2>&1 | grep -E "^decode|INT4"; done
echo "== trace, W4A16"
OUT=$OUT timeout 60 bash tests/gpu/trace_decode.sh $CA 0 64 1 16 | head -24
timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_int4.py -k bandwidth 2>&1 | grep -E "INT4 GEMV|passed|failed"
find $OUT -type f -delete
