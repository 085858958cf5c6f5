# Session 47's last try (budget ~400 s): only on an H200 (exits at once on another card): one round
# of run30/call1.sh's A/B, then issue 22's prefill-8k and batch-1 figures at HEAD.
nvidia-smi --query-gpu=name --format=csv,noheader | tee /tmp/gpu.txt; grep -q H200 /tmp/gpu.txt || exit 0
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
C=bench/configs/meta-llama__Llama-3.1-8B.json
echo "== prefill 8192"
timeout 90 build-gpu/kaon bench latency --device cuda --load-format dummy -m $C --batch-sizes 1 --input-len 8192 \
    --output-len 2 --num-iters 3 --num-iters-warmup 1 --quiet --output-json $OUT/p8k.json 2>&1 | tail -2 | head -1
python3 bench/roofline.py $C --prefill $OUT/p8k.json | head -1
echo -n "bf16 b1: "; timeout 60 python3 bench/gpu_decode.py --kaon build-gpu/kaon --tokens 256 2>&1 | grep -E "^decode"
cp build-gpu/kaon /tmp/kaon-head
cp alt/* src/backend/cuda/ && ninja -C build-gpu kaon > /tmp/alt_build.txt 2>&1 && cp build-gpu/kaon /tmp/kaon-alt; echo "alt build rc=$?"
C8=bench/configs/llama-3.1-8b-fp8-block.json
for v in head alt fuse; do
    k=/tmp/kaon-$v; [ $v = fuse ] && k=/tmp/kaon-alt
    echo -n "FP8 $v: "; env $([ $v = fuse ] && echo KAON_FP8_GEMV_FUSE=1 || echo X=1) timeout 60 \
        python3 bench/gpu_decode.py --kaon $k --config $C8 --tokens 256 2>&1 | grep -E "^decode"
done
for v in head alt; do echo -n "W4A16 $v: "; timeout 60 python3 bench/gpu_decode.py --kaon /tmp/kaon-$v \
    --config bench/configs/llama-3.1-8b-awq-g128.json --tokens 256 2>&1 | grep -E "^decode"; done
find $OUT -type f -delete
