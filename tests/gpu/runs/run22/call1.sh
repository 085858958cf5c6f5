# Call 1: build; FP8 decode (fragments from the e4m3 codes, helper-53) tests + dec_bench A/B; wgmma
# prefill (helper-52) tests + attn_bench A/B; attention/model/MoE tests; batch 1; 64/256 in flight.
set -x
export KAON_NINJA_JOBS=16
tests/gpu/run_all.sh build > $OUT/build_stdout.txt 2>&1; tail -3 $OUT/build_stdout.txt
source tests/gpu/runs/run21/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
timeout 150 python3 -m pytest -q --maxfail=30 tests/gpu/test_gpu_kv_fp8.py > $OUT/pytest_kvfp8.txt 2>&1; tail -3 $OUT/pytest_kvfp8.txt
for i in 1 2; do KAON_DTC_FP8_FRAG=1 build-gpu/gpu_driver dec_bench 32 8 128 fp8 > $OUT/dec_fp8_new$i.txt 2>&1; build-gpu/gpu_driver dec_bench 32 8 128 fp8 > $OUT/dec_fp8_old$i.txt 2>&1; done
build-gpu/gpu_driver dec_bench 32 8 128 > $OUT/dec_bf16.txt 2>&1
tail -4 $OUT/dec_fp8_new1.txt $OUT/dec_fp8_old1.txt $OUT/dec_fp8_new2.txt $OUT/dec_fp8_old2.txt $OUT/dec_bf16.txt
timeout 120 python3 -m pytest -q tests/gpu/test_gpu.py -k "test_attention_prefill and wgmma" > $OUT/pytest_wgmma.txt 2>&1; tail -15 $OUT/pytest_wgmma.txt
KAON_FA_WGMMA=1 timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 > $OUT/attn_wgmma.txt 2>&1; timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 > $OUT/attn_mma.txt 2>&1; tail -6 $OUT/attn_wgmma.txt $OUT/attn_mma.txt
KAON_FA_WGMMA=1 KAON_FA_WGMMA_FENCE=1 timeout 60 build-gpu/gpu_driver attn_bench 32 8 128 16384 0 > $OUT/attn_wgmma_fence.txt 2>&1; tail -6 $OUT/attn_wgmma_fence.txt
KAON_FA_WGMMA_FENCE=1 timeout 120 python3 -m pytest -q tests/gpu/test_gpu.py -k "test_attention_prefill and wgmma" > $OUT/pytest_wgmma_fence.txt 2>&1; tail -3 $OUT/pytest_wgmma_fence.txt
timeout 150 python3 -m pytest -q -x tests/gpu/test_gpu.py tests/gpu/test_gpu_moe.py -k "(attention and not wgmma) or small_vs_transformers or tiny_model or moe" > $OUT/pytest.txt 2>&1; tail -3 $OUT/pytest.txt
