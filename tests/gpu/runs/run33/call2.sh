# Session 50, call 2 (any GPU, ~330 s): INT4 GEMV loads in flight per lane (ncu in call 1: long-scoreboard
# stalls first, 17-23% of the warp slots active). The caller puts in alt/: u16plain.cu (16 vectors per
# lane for one weight, gate/up as before), u16all.cu (gate/up 8 per weight too; small spills at 128
# registers), u16lb3.cu (as u16all, the 4-warp gate/up at 3 blocks per SM: no spills).
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check|prefetch_check" /tmp/build_stdout.txt | head -3
source tests/gpu/runs/run21/env.sh
CA=bench/configs/llama-3.1-8b-awq-g128.json
cp build-gpu/kaon /tmp/kaon-head
bw() { timeout 40 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_int4.py -k bandwidth 2>&1 | grep -E "INT4 GEMV" | grep -v "n=4" | tr '\n' ' '; echo; }
echo -n "head GEMV: "; bw
cp src/backend/cuda/cuda_int4.cu /tmp/head_int4.cu
for v in u16plain u16all u16lb3; do
    cp alt/$v.cu src/backend/cuda/cuda_int4.cu && tests/gpu/run_all.sh build > /tmp/alt_$v.txt 2>&1 && cp build-gpu/kaon /tmp/kaon-$v
    echo "$v: $(grep -E "build rc|prefetch_check" /tmp/alt_$v.txt | tr '\n' ' ')"; echo -n "$v GEMV: "; bw
done
for r in 1 2; do for v in head u16plain u16all u16lb3; do echo -n "W4A16 $v: "; timeout 30 python3 bench/gpu_decode.py \
    --kaon /tmp/kaon-$v --config $CA --tokens 256 2>&1 | grep -E "^decode"; done; done
echo "== test_gpu_int4.py on u16lb3"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_int4.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -4
cp /tmp/head_int4.cu src/backend/cuda/cuda_int4.cu
find $OUT -type f -delete
