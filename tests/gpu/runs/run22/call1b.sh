# Call 1b (a short budget): build; the two opt-in kernels' tests against the NumPy references and their A/B benches.
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; tail -2 $OUT/build_stdout.txt
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -q tests/gpu/test_gpu.py -k "test_attention_prefill and wgmma" > $OUT/pytest_wgmma.txt 2>&1; tail -8 $OUT/pytest_wgmma.txt
KAON_FA_WGMMA=1 timeout 40 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 > $OUT/attn_wgmma.txt 2>&1; timeout 40 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 > $OUT/attn_mma.txt 2>&1; tail -5 $OUT/attn_wgmma.txt $OUT/attn_mma.txt
timeout 90 python3 -m pytest -q tests/gpu/test_gpu_kv_fp8.py -k "frag" > $OUT/pytest_frag.txt 2>&1; tail -8 $OUT/pytest_frag.txt
KAON_DTC_FP8_FRAG=1 timeout 30 build-gpu/gpu_driver dec_bench 32 8 128 fp8 > $OUT/dec_frag.txt 2>&1; timeout 30 build-gpu/gpu_driver dec_bench 32 8 128 fp8 > $OUT/dec_widen.txt 2>&1; tail -4 $OUT/dec_frag.txt $OUT/dec_widen.txt
