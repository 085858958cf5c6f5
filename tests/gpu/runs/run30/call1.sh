# H200 A/B of session 47's reverted kernels (tests/gpu/NOTES.md, session 47): the caller puts the
# CUDA sources of cc371cc in alt/ beside the snapshot (cuda_fp8.cu, cuda_int4.cu, cuda_backend.cu,
# cuda_internal.h, cuda_linear.cu, cuda_norm_row.cuh). Default = HEAD's kernels; alt = persistent
# FP8 / W4A16 GEMVs (and KAON_FP8_GEMV_FUSE=1 there). ~300 s.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > /tmp/build_stdout.txt 2>&1; grep -E "build rc|pdl_check" /tmp/build_stdout.txt | head -2
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
cp build-gpu/kaon /tmp/kaon-head
cp alt/* src/backend/cuda/ && ninja -C build-gpu kaon > /tmp/alt_build.txt 2>&1 && cp build-gpu/kaon /tmp/kaon-alt; echo "alt build rc=$?"
C8=bench/configs/llama-3.1-8b-fp8-block.json
for r in 1 2; do
    for v in head alt fuse; do
        k=/tmp/kaon-$v; [ $v = fuse ] && k=/tmp/kaon-alt
        echo -n "FP8 $v: "; env $([ $v = fuse ] && echo KAON_FP8_GEMV_FUSE=1 || echo X=1) timeout 60 \
            python3 bench/gpu_decode.py --kaon $k --config $C8 --tokens 256 2>&1 | grep -E "^decode"
    done
    for v in head alt; do echo -n "W4A16 $v: "; timeout 60 python3 bench/gpu_decode.py --kaon /tmp/kaon-$v \
        --config bench/configs/llama-3.1-8b-awq-g128.json --tokens 256 2>&1 | grep -E "^decode"; done
done
find $OUT -type f -delete
